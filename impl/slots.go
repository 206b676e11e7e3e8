package impl

import (
	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// slots is the bookkeeping of a node's worker slots. A claim reserves the
// slots it may fill before its statement goes out (reserve), gives back
// those it did not fill (unreserve), and each run gives its slot back when
// its behavior returns (free). Behaviors with a per-node cap (a maximum
// concurrency or a rotation's maximum) are counted apart, so that a claim
// never takes more of them than the cap leaves. Server.mu guards it.
type slots struct {
	max      int                    // the node's MaxWorkers
	taken    int                    // reserved by claims in flight, or running a behavior
	reserved int                    // reserved by claims in flight
	capped   map[api.BehaviorID]int // taken per capped behavior
}

func newSlots(max int) slots { return slots{max: max, capped: map[api.BehaviorID]int{}} }

// free reports how many slots no claim or run holds.
func (s *slots) free() int { return s.max - s.taken }

// running reports how many slots hold a run.
func (s *slots) running() int { return s.taken - s.reserved }

// left reports how many more runs of behavior p allows on this node
// besides n (the node's free slots), and whether p caps them at all.
func (s *slots) left(b api.BehaviorID, p spi.Policy, n int) (int, bool) {
	capped := false
	if p.MaxConcurrency > 0 {
		n, capped = min(n, p.MaxConcurrency-s.capped[b]), true
	}
	if r := p.Rotation; r != nil {
		n, capped = min(n, r.MaxRunning-s.capped[b]), true
	}
	return max(n, 0), capped
}

// reserve takes up to limit slots for a claim of the capped behaviors
// (and any others), no more than are free and than each capped behavior
// has left, and returns how many it took.
func (s *slots) reserve(limit int, capped []api.BehaviorID, policy func(api.BehaviorID) spi.Policy) int {
	limit = min(limit, s.free())
	for _, b := range capped {
		limit, _ = s.left(b, policy(b), limit)
	}
	if limit <= 0 {
		return 0
	}
	s.taken += limit
	s.reserved += limit
	for _, b := range capped {
		s.capped[b] += limit
	}
	return limit
}

// unreserve ends a claim that reserved limit slots: the claimed tasks'
// slots now hold runs, the rest are free again.
func (s *slots) unreserve(limit int, capped []api.BehaviorID, claimed []store.Claimed) {
	s.taken -= limit - len(claimed)
	s.reserved -= limit
	for _, b := range capped {
		n := 0
		for _, c := range claimed {
			if c.Behavior == b {
				n++
			}
		}
		s.capped[b] -= limit - n
	}
}

// keep keeps the slot of a run that returned for the hand-over of its
// finish (see Server.handsOver): the slot holds no run, and stays taken,
// reserved as for a claim in flight, and counted against its behavior's
// cap.
func (s *slots) keep() { s.reserved++ }

// unkeep frees a slot of a run of behavior b, which policy p caps or
// not, that keep kept and no hand-over filled.
func (s *slots) unkeep(b api.BehaviorID, p spi.Policy) {
	s.reserved--
	s.release(b, p)
}

// release gives back the slot of a run of behavior b, which policy p caps
// or not, once its behavior returned.
func (s *slots) release(b api.BehaviorID, p spi.Policy) {
	s.taken--
	if p.MaxConcurrency > 0 || p.Rotation != nil {
		s.capped[b]--
	}
}
