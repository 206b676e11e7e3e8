package impl

import (
	"context"
	mrand "math/rand/v2"
	"slices"
	"time"

	"github.com/stinthq/stint/spi"
)

// rotateLoop runs the rotation of a preemptible behavior (spi.Rotation):
// each interval it resets the churn budget, then stops the oldest runs
// that ran long enough, as many as tasks wait beyond the free slots. The
// claimer starts waiting tasks within what is left of the budget.
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
		s.churn[b.ID] = 0
		free := rot.MaxRunning - s.perBehav[b.ID]
		var old []*run
		now := time.Now()
		for _, r := range s.running {
			if r.reg == b && now.Sub(r.started) >= rot.MinRunTime {
				old = append(old, r)
			}
		}
		slices.SortFunc(old, func(a, b *run) int { return a.started.Compare(b.started) })
		stop := min(pending-free, rot.MaxChurn, len(old))
		for _, r := range old[:max(stop, 0)] {
			r.cancel(spi.ErrPreempted)
			s.churn[b.ID]++
		}
		s.mu.Unlock()
		if stop > 0 {
			s.log.Info("stint: rotation stopped runs for waiting tasks", "behavior", b.ID, "stopped", stop, "waiting", pending)
			s.wakeClaimer()
		}
	}
}
