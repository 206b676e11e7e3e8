package impl

import (
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
// its tasks at once: it runs b, and b caps no group key (a cap counts the
// running tasks of a key across nodes, which only a claim does).
func (s *Server) localBehavior(b api.BehaviorID) *spi.Registration {
	for _, reg := range s.behaviors {
		if reg.ID == b {
			if reg.Policy.GroupConcurrency > 0 {
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
func (s *Server) reserveStarts(tasks []store.NewTask) bool {
	if s.cfg.NoLocalStart {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.stopped || s.halt != nil {
		return false
	}
	marked := false
	for i := range tasks {
		t := &tasks[i]
		reg := s.localBehavior(t.Behavior)
		if t.Delay != 0 || reg == nil {
			continue
		}
		if s.slots.reserve(1, startCapped(reg), s.policy) == 0 {
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
