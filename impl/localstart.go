package impl

import (
	"context"
	"slices"
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

// startHere decides whether a due task may start on this node now
// without a claim (a local start), and reserves its slot when it may. A
// server's own submits ask it (reserveStarts); the ends of
// workflow nodes, whose statement learns which nodes became ready only as
// it runs, reserve their slots before the nodes' behaviors are known, for
// the behaviors this rule admits with no cap of their own on the node
// (offerNodeStarts). The rules, in the
// process: the server runs (started, not stopped); the task is due now
// (delay zero) and spends no rate limit (rated false: a claim spends
// those); this node runs its behavior b, which caps neither a group key
// nor its runs across the cluster (GroupConcurrency, ClusterConcurrency:
// such caps count running tasks across nodes, which only a claim does);
// and a slot is free under MaxWorkers and b's own caps on this node
// (MaxConcurrency, a rotation's MaxRunning), as for a claim. What only the
// database knows (b paused or capped at runtime, the group key held, a due
// task of b with the same or a higher priority waiting for a claim, a
// workflow node's readiness) the statement that starts the task checks;
// a task it does not start waits for a claim.
//
// It returns the lease the task starts under, zero when it may not start
// here; noSlot reports that only a free slot was missing. The caller gives
// the slot back with unstart, or hands it to the run with startedHere.
// s.mu is held.
func (s *Server) startHere(b api.BehaviorID, delay time.Duration, rated bool) (lease time.Duration, noSlot bool) {
	if !s.startsRuns() || delay != 0 || rated {
		return 0, false
	}
	reg := s.behavior(b)
	if reg == nil || reg.Policy.GroupConcurrency > 0 || reg.Policy.ClusterConcurrency > 0 {
		return 0, false
	}
	s.localAt = time.Now()
	if s.slots.reserve(1, startCapped(reg), s.policy) == 0 {
		return 0, true
	}
	return reg.Policy.Lease, false
}

// unstart gives back the slot startHere reserved for a task of behavior b
// that did not start. s.mu is held.
func (s *Server) unstart(b api.BehaviorID) {
	s.slots.unreserve(1, startCapped(s.behavior(b)), nil)
}

// behavior returns the registration of behavior b if this node runs it,
// else nil.
func (s *Server) behavior(b api.BehaviorID) *spi.Registration {
	for _, reg := range s.behaviors {
		if reg.ID == b {
			return reg
		}
	}
	return nil
}

// reserveStarts sets the start lease of each of tasks that may start on
// this node (see startHere) and reserves a slot for each.
//
// A claim statement holds the slots it reserved while it is in the
// database. While the node's own submits start tasks here and a claim
// group found no backlog, its claims reserve only half of their slots (see
// claimRoom), so that a submit finds the other half free. Should none be
// free, and the node's last claim found no backlog, the submit waits for
// the claims in flight to return (at most localStartWait) rather than fall
// back at once: a fallback wakes a claim, which would hold the slots the
// next submit needs, so that under a stream of the node's own submits each
// would fall back in turn. It waits once per submit.
//
// Slots reserved for a submit are held from the claimers for the submit
// statement's time, so a submit takes none that its statement would not
// fill. While the node's last claim of a main claim group came back full
// (a backlog waits), it starts nothing here: the statement would leave
// its tasks behind the backlog of their behavior anyway. A submit of more
// tasks than the node has slots takes at most half of the free ones,
// rounded up, and does not wait: the claimers take the rest. A burst of
// SubmitMany calls of 5,000 ran a tenth slower before these two rules.
func (s *Server) reserveStarts(ctx context.Context, tasks []store.NewTask) bool {
	if s.cfg.NoLocalStart {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mainBacklog() {
		return false
	}
	room, mayWait := len(tasks), true
	if len(tasks) > s.slots.max {
		room, mayWait = (s.slots.free()+1)/2, false
	}
	marked := false
	for i := range tasks {
		if room == 0 {
			break
		}
		t := &tasks[i]
		lease, noSlot := s.startHere(t.Behavior, t.Delay, len(t.RateUses) > 0)
		if noSlot && mayWait && s.claiming > 0 {
			mayWait = false // once per submit
			if !s.waitClaims(ctx) {
				// The server stopped meanwhile: Stop may be waiting
				// for local starts already, so none may begin.
				s.unreserveStarts(tasks[:i])
				return false
			}
			lease, _ = s.startHere(t.Behavior, t.Delay, len(t.RateUses) > 0)
		}
		if lease == 0 {
			continue
		}
		t.StartLease = lease
		marked = true
		room--
	}
	if marked {
		// Stop waits for the submit: its runs must start before Stop
		// waits for the runs.
		s.localStarts.Add(1)
	}
	return marked
}

// mainBacklog reports whether the last claim of a main claim group (see
// claimGroup.key) found as many tasks as it asked for. s.mu is held.
func (s *Server) mainBacklog() bool {
	for k, full := range s.backlog {
		if full && (k == "" || k[0] == 0) {
			return true
		}
	}
	return false
}

// unreserveStarts gives back the slots reserveStarts reserved for tasks
// and clears their start leases. s.mu is held.
func (s *Server) unreserveStarts(tasks []store.NewTask) {
	for i := range tasks {
		if tasks[i].StartLease > 0 {
			s.unstart(tasks[i].Behavior)
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
	return s.startsRuns()
}

// startsRuns reports whether the server starts runs: it started, and
// neither stopped nor halted them. s.mu is held.
func (s *Server) startsRuns() bool {
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
	var reserved []api.BehaviorID
	for _, t := range tasks {
		if t.StartLease > 0 {
			reserved = append(reserved, t.Behavior)
		}
	}
	s.startedHere(reserved, started, sent)
}

// startedHere ends the local starts of slots startHere reserved, one per
// behavior in reserved: the tasks that started (started, a subset of
// them, each of a behavior in reserved) take theirs and their runs begin,
// as claimed ones do; the other slots are given back. sent is when the
// statement that started them was sent.
func (s *Server) startedHere(reserved []api.BehaviorID, started []store.Claimed, sent time.Time) {
	s.mu.Lock()
	for i, c := range started {
		s.slots.unreserve(1, startCapped(s.behavior(c.Behavior)), started[i:i+1])
	}
	unused := len(reserved) - len(started)
	if unused > 0 {
		left := map[api.BehaviorID]int{}
		for _, b := range reserved {
			left[b]++
		}
		for _, c := range started {
			left[c.Behavior]--
		}
		for b, n := range left {
			for range n {
				s.unstart(b)
			}
		}
	}
	s.mu.Unlock()
	s.startRuns(started, sent)
	if unused > 0 {
		// A slot given back may let a claimer go on.
		signal(s.slotFreed)
	}
}

// offerStarts returns what the statement recording batch may start on
// this node, and the function that ends it: the workflow nodes the
// batch's ends make ready (see offerNodeStarts; none with
// ServerConfig.NoLocalStart), and the hand-over of the slots its runs kept
// (see handsOver).
func (s *Server) offerStarts(batch []*run) (store.LocalStart, func([]store.Claimed, time.Time, error)) {
	var start store.LocalStart
	var nodes func([]store.Claimed, time.Time)
	if !s.cfg.NoLocalStart {
		start, nodes = s.offerNodeStarts(batch)
	}
	h := s.offerHandOver(batch)
	if nodes == nil && h == nil {
		return store.LocalStart{}, nil
	}
	if h != nil {
		start.Node, start.HandOver, start.HandedOver = s.cfg.Node, h.reqs, h.handed
	}
	return start, func(started []store.Claimed, sent time.Time, err error) {
		if nodes != nil {
			nodes(started, sent)
		}
		if h != nil {
			h.end(sent, err)
		}
	}
}

// offerNodeStarts returns the local start that the statement recording
// batch may make of the workflow nodes the batch's ends make ready (see
// ServerConfig.NoLocalStart and store.Store.FinishStart), and the
// function that ends it. It offers none unless a run of the batch ended a
// workflow node for good and this node runs behaviors that cap nothing.
// The slots are reserved only when the store asks, as it is about to run
// a statement that may start nodes (most ends of nodes wake none): half
// of the free ones, rounded up, the rest staying with the claimers while
// that statement is out.
func (s *Server) offerNodeStarts(batch []*run) (store.LocalStart, func([]store.Claimed, time.Time)) {
	if len(s.nodeStarters) == 0 || !slices.ContainsFunc(batch, endsNode) {
		return store.LocalStart{}, nil
	}
	o := &nodeOffer{s: s}
	return store.LocalStart{Node: s.cfg.Node, Behaviors: s.nodeStarters, Reserve: o.reserve}, o.started
}

// endsNode reports whether r's end may make workflow nodes ready: it
// ended a task for good whose id is its parent's followed by a slash, as
// a workflow node's is.
func endsNode(r *run) bool {
	id, parent := string(r.claimed.ID), string(r.claimed.ParentID)
	return !r.end.Again && (r.end.Status == api.StatusSuccess || r.end.Status == api.StatusFailure) && parent != "" &&
		len(id) > len(parent) && id[len(parent)] == '/' && id[:len(parent)] == parent
}

// nodeOffer is a local start offerNodeStarts offered: the slots it
// reserved, once the store asked.
type nodeOffer struct {
	s     *Server
	limit int
}

// reserve reserves half of the free slots, rounded up, and returns how
// many, none once the server stops starting runs.
func (o *nodeOffer) reserve() int {
	s := o.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.startsRuns() {
		return 0
	}
	o.limit = s.slots.reserve((s.slots.free()+1)/2, nil, s.policy)
	if o.limit > 0 {
		// Stop waits for the offer to end: its runs must start before
		// Stop waits for the runs.
		s.localStarts.Add(1)
	}
	return o.limit
}

// started ends the offer: the tasks that started take their slots and
// their runs begin, as claimed ones do; the other slots are given back.
// sent is when the statement was sent.
func (o *nodeOffer) started(started []store.Claimed, sent time.Time) {
	if o.limit == 0 {
		return
	}
	s := o.s
	defer s.localStarts.Done()
	s.mu.Lock()
	s.slots.unreserve(o.limit, nil, started)
	if len(started) > 0 {
		s.localAt = time.Now()
	}
	s.mu.Unlock()
	s.startRuns(started, sent)
	if len(started) < o.limit {
		// A slot given back may let a claimer go on.
		signal(s.slotFreed)
	}
}
