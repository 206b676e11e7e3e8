package impl

import (
	"context"
	mrand "math/rand/v2"
	"slices"
	"time"

	"github.com/stinthq/stint/spi"
)

// rotateLoop runs the rotation of a preemptible behavior (spi.Rotation),
// by the CouchDB replicator's rule: each interval it stops the oldest runs
// that ran long enough, as many as tasks wait beyond the free slots and at
// most MaxChurn, and the claimer starts as many waiting tasks in their
// place as soon as their slots are given back. Stops are paired with
// starts, so the node keeps MaxRunning tasks running: free slots (and
// stops whose replacement has not begun yet) count against the budget,
// so that the node never has more than MaxChurn slots in transition.
func (s *Server) rotateLoop(ctx context.Context, b *spi.Registration) {
	rot := *b.Policy.Rotation
	for {
		sleep(ctx, rot.Interval+time.Duration(mrand.Int64N(int64(rot.Interval)/3+1)))
		if ctx.Err() != nil {
			return
		}
		pending, err := s.st.PendingCount(ctx, b.ID, 0)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("stint: rotation: counting waiting tasks failed", "behavior", b.ID, "err", err)
			}
			continue
		}
		s.mu.Lock()
		free, _ := s.slots.left(b.ID, b.Policy, s.slots.free())
		var old []*run
		stopping := 0 // cancelled, slot not given back yet; or claimed, not begun yet
		now := time.Now()
		for _, r := range s.running {
			switch {
			case r.reg != b:
			case r.ctx.Err() != nil || !r.begun.Load():
				stopping++
			case now.Sub(r.started) >= rot.MinRunTime:
				old = append(old, r)
			}
		}
		slices.SortFunc(old, func(a, b *run) int { return a.started.Compare(b.started) })
		stop := max(min(pending-free, rot.MaxChurn-free-stopping, len(old)), 0)
		for _, r := range old[:stop] {
			r.cancel(spi.ErrPreempted)
		}
		s.mu.Unlock()
		if stop > 0 {
			s.log.Info("stint: rotation stopped runs for waiting tasks", "behavior", b.ID, "stopped", stop, "waiting", pending)
		}
	}
}
