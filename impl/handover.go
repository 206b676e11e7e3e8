package impl

// The hand-over: the finish that records the end of a run at a cap of
// its behavior claims, in its own transaction, the next tasks for the
// slots it frees, and the node starts them at once.

import (
	"context"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// keepSlot keeps the slot of run r, whose behavior returned and whose end
// the completer is about to record, for the hand-over of that finish when
// handsOver says so, and reports whether it did. The finish claims the
// next task for the slot, which the claimers leave alone meanwhile:
// nothing is woken. A slot not kept is for freeSlot to free.
func (s *Server) keepSlot(r *run) bool {
	s.capsMu.Lock()
	freedCap := s.cappedLately(r.claimed.Behavior)
	s.capsMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	r.freedCap = freedCap
	if !s.handsOver(r) {
		return false
	}
	r.returned, r.handed = true, true
	s.slots.keep()
	return true
}

// handsOver decides, as run r returns, whether its slot is kept for the
// hand-over of its finish rather than freed: when r's behavior is at a
// cap that binds (its MaxConcurrency on this node, found full by the
// claimers, or a cap across nodes a claim found full lately) while the
// node has other slots free, and the completer records r's end at once
// (see completer.promise). Rotations, children and runs that sleep on a
// signal hand nothing over (see store.Store.FinishStart). A kept slot
// stays reserved, so that no claim takes it nor counts r's task as ended,
// until the finish's claim fills it or handOver.end frees it. Server.mu
// is held.
func (s *Server) handsOver(r *run) bool {
	if !s.cfg.HandOver || !s.startsRuns() || s.slots.free() <= 0 {
		return false
	}
	p := r.reg.Policy
	if p.Rotation != nil || r.end.HasParent || r.end.WaitSignal != "" {
		return false
	}
	perNode := p.MaxConcurrency > 0 && s.atCap[r.claimed.Behavior]
	shared := (p.GroupConcurrency > 0 || p.ClusterConcurrency > 0) && r.freedCap
	return (perNode || shared) && s.completer.promise()
}

// handOver is the hand-over a finish makes for the kept slots of the
// runs of its batch (see handsOver): a claim per behavior, of as many
// tasks as the batch's runs of it kept slots.
type handOver struct {
	s       *Server
	runs    []*run // the batch's runs that kept their slots
	reqs    []store.ClaimRequest
	kept    []int // per claim, the slots kept for it
	flow    []bool
	heard   []bool // per claim, the finish reported what it took
	claimed [][]store.Claimed
	held    []store.FlowHeld
}

// offerHandOver returns the hand-over of the runs of batch that kept
// their slots, or nil when none did. When the server no longer starts
// runs, it frees their slots instead and returns nil.
func (s *Server) offerHandOver(batch []*run) *handOver {
	s.mu.Lock()
	var runs []*run
	for _, r := range batch {
		if r.handed {
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		s.mu.Unlock()
		return nil
	}
	h := &handOver{s: s, runs: runs}
	if !s.startsRuns() {
		s.mu.Unlock()
		h.end(time.Now(), nil)
		return nil
	}
	s.capsMu.Lock()
	caps := s.caps
	s.capsMu.Unlock()
	at := map[api.BehaviorID]int{}
	for _, r := range runs {
		b := r.claimed.Behavior
		i, ok := at[b]
		if !ok {
			p := r.reg.Policy
			req := store.ClaimRequest{Node: s.cfg.Node, Behaviors: []store.BehaviorLease{{Behavior: b, Lease: p.Lease}},
				LookAhead: s.cfg.LookAhead, Leases: drawLeases(1)}
			flow := flowControlled(r.reg) || caps[b]
			if flow {
				// Returned stays empty: the finish's own runs are ended in
				// its transaction, and the others count as running, so a
				// hand-over never takes the slot of a run whose end is not
				// recorded yet.
				req.PerGroup, req.Cluster, req.FairShare, req.Flow = p.GroupConcurrency, p.ClusterConcurrency, p.FairShare, true
				req.Busy = s.flowBusy[b]
			}
			i = len(h.reqs)
			at[b] = i
			h.reqs, h.kept, h.flow = append(h.reqs, req), append(h.kept, 0), append(h.flow, flow)
		}
		h.kept[i]++
		h.reqs[i].Limit++
	}
	h.heard = make([]bool, len(h.reqs))
	h.claimed = make([][]store.Claimed, len(h.reqs))
	h.held = make([]store.FlowHeld, len(h.reqs))
	// Stop waits for the hand-over to end: its runs must start before
	// Stop waits for the runs.
	s.localStarts.Add(1)
	s.mu.Unlock()
	return h
}

// handed records what the finish's claim i took; see
// store.LocalStart.HandedOver.
func (h *handOver) handed(i int, claimed []store.Claimed, held store.FlowHeld) {
	h.heard[i], h.claimed[i], h.held[i] = true, claimed, held
}

// end ends the hand-over once its finish returned (err its error, sent
// when it was sent): the tasks its claims took take the kept slots and
// their runs begin, as claimed ones do; the other kept slots are freed,
// and the claimers woken for them, as the runs' return would have done.
// Claims the finish did not report on, when it failed, may have committed
// all the same: what they took is given back (see releaseClaim).
func (h *handOver) end(sent time.Time, err error) {
	s := h.s
	if h.reqs != nil {
		defer s.localStarts.Done()
	}
	ctx := context.Background()
	var started []store.Claimed
	freed, shared := false, false
	s.mu.Lock()
	for _, r := range h.runs {
		r.handed = false
	}
	left := map[api.BehaviorID]int{} // kept slots per behavior that no claim filled
	for _, r := range h.runs {
		left[r.claimed.Behavior]++
	}
	for i, req := range h.reqs {
		b := req.Behaviors[0].Behavior
		claimed := h.claimed[i]
		left[b] -= len(claimed)
		s.slots.unreserve(len(claimed), startCapped(s.behavior(b)), claimed)
		started = append(started, claimed...)
		if h.flow[i] && h.heard[i] {
			if s.flowBusy == nil {
				s.flowBusy = map[api.BehaviorID]bool{}
			}
			s.flowBusy[b] = len(claimed) > 0
		}
	}
	for _, r := range h.runs {
		b := r.claimed.Behavior
		if left[b] <= 0 {
			r.refilled = true // its slot holds a run again: see capsFreed
			continue
		}
		left[b]--
		s.slots.unkeep(b, r.reg.Policy)
		delete(s.atCap, b)
		s.forgetEmpty(b)
		freed = true
		shared = shared || r.freedCap
	}
	s.mu.Unlock()
	for i, req := range h.reqs {
		switch {
		case !h.heard[i] && err != nil:
			go s.releaseClaim(req)
		case h.flow[i] && h.heard[i]:
			b := req.Behaviors[0].Behavior
			if h.held[i].Capped {
				s.noteCapped(b, true)
			}
			s.kick.kickAfter(h.held[i].Wake)
			s.tel.delayed(ctx, h.held[i].Delayed, b)
		}
		if h.heard[i] {
			s.tel.claimDone(ctx, h.claimed[i], time.Since(sent))
		}
	}
	s.handedOver.Add(int64(len(started)))
	s.startRuns(started, sent)
	if freed {
		signal(s.slotFreed)
		signal(s.capFreed)
		if shared {
			signal(s.sharedFreed)
		}
	}
}
