package impl

import (
	"context"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// A server's own submits start their new due tasks at once on its node,
// when it has free slots for them (see ServerConfig.NoLocalStart): the
// submit statement stores them running under a lease for the node, and
// the server starts their runs as it starts claimed ones. Which tasks the
// statement starts is the store's to say (store.Store.SubmitStart): it
// leaves a task to the claimers when its id existed, its behavior is
// paused, its group key held, or a due task of its behavior with the same
// or a higher priority waits for a claim.

// localBehavior returns the registration of b when this node may start
// its tasks at once: it runs b, and b's policy caps neither a group key nor
// the behavior across the cluster (a cap counts the running tasks across
// nodes, which only a claim does; a cap set at runtime is checked by the
// submit statement).
func (s *Server) localBehavior(b api.BehaviorID) *spi.Registration {
	for _, reg := range s.behaviors {
		if reg.ID == b {
			if reg.Policy.GroupConcurrency > 0 || reg.Policy.ClusterConcurrency > 0 {
				return nil
			}
			return reg
		}
	}
	return nil
}

// reserveStarts sets the start lease of each of tasks that may start on
// this node, due now and of a behavior it runs, and reserves a slot for
// each, as a claim reserves its slots; see starter.
//
// A claim statement holds the slots it reserved while it is in the
// database. A submit that finds none free then, when the node's last
// claim found no backlog, waits for the claims in flight to return (at
// most localStartWait) rather than fall back at once: a fallback wakes a
// claim, which would hold the slots the next submit needs, so that under
// a stream of the node's own submits each would fall back in turn. It
// waits once per submit. With a backlog it does not wait: the submit
// statement leaves its tasks to the claimers anyway.
func (s *Server) reserveStarts(ctx context.Context, tasks []store.NewTask) bool {
	if s.cfg.NoLocalStart {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.stopped || s.halt != nil {
		return false
	}
	marked, waited := false, false
	for i := range tasks {
		t := &tasks[i]
		reg := s.localBehavior(t.Behavior)
		if t.Delay != 0 || reg == nil || len(t.RateUses) > 0 {
			// A task that uses rate limits starts through a claim,
			// which spends them.
			continue
		}
		n := s.slots.reserve(1, startCapped(reg), s.policy)
		if n == 0 && !waited && s.idle && s.claiming > 0 {
			waited = true
			if !s.waitClaims(ctx) {
				// The server stopped meanwhile: Stop may be waiting
				// for local starts already, so none may begin.
				s.unreserveStarts(tasks[:i])
				return false
			}
			n = s.slots.reserve(1, startCapped(reg), s.policy)
		}
		if n == 0 {
			continue
		}
		t.StartLease = reg.Policy.Lease
		marked = true
	}
	if marked {
		// Stop waits for the submit: its runs must start before Stop
		// waits for the runs.
		s.localStarts.Add(1)
	}
	return marked
}

// unreserveStarts gives back the slots reserveStarts reserved for tasks
// and clears their start leases. s.mu is held.
func (s *Server) unreserveStarts(tasks []store.NewTask) {
	for i := range tasks {
		if tasks[i].StartLease > 0 {
			s.slots.unreserve(1, startCapped(s.localBehavior(tasks[i].Behavior)), nil)
			tasks[i].StartLease = 0
		}
	}
}

// localStartWait bounds how long a submit waits for the claims in flight
// to give back their slots (see reserveStarts): a claim that finds no
// backlog returns within about a millisecond.
const localStartWait = 20 * time.Millisecond

// waitClaims waits, with s.mu held and unlocked meanwhile, until a claim
// in flight returned, s.startWait passed or ctx ended. It reports whether
// the server still starts runs.
func (s *Server) waitClaims(ctx context.Context) bool {
	returned := s.claimReturned
	s.startWaiting++
	s.mu.Unlock()
	timer := time.NewTimer(s.startWait)
	select {
	case <-returned:
	case <-timer.C:
	case <-ctx.Done():
	}
	timer.Stop()
	s.mu.Lock()
	s.startWaiting--
	return s.started && !s.stopped && s.halt == nil
}

// startCapped returns the behaviors a slot reserved for a run of reg
// counts against besides the node's: reg's own, if it caps its runs per
// node.
func startCapped(reg *spi.Registration) []api.BehaviorID {
	if reg.Policy.MaxConcurrency > 0 || reg.Policy.Rotation != nil {
		return []api.BehaviorID{reg.ID}
	}
	return nil
}

// submitStarted starts the runs of the tasks a submit started and gives
// back the slots reserved for the others; see starter.
func (s *Server) submitStarted(tasks []store.NewTask, started []store.Claimed, sent time.Time) {
	defer s.localStarts.Done()
	s.mu.Lock()
	next, unused := started, 0
	for _, t := range tasks {
		if t.StartLease <= 0 {
			continue
		}
		if len(next) == 0 || next[0].ID != t.ID {
			unused++
		}
		var mine []store.Claimed
		if len(next) > 0 && next[0].ID == t.ID {
			mine, next = next[:1], next[1:]
		}
		reg, _ := s.cfg.Registry.Lookup(t.Behavior)
		s.slots.unreserve(1, startCapped(reg), mine)
	}
	s.mu.Unlock()
	s.startRuns(started, sent)
	if unused > 0 {
		// A slot given back may let a claimer go on.
		signal(s.slotFreed)
	}
}
