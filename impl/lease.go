package impl

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// errLeaseExpired cancels a run whose lease could not be renewed in time.
var errLeaseExpired = fmt.Errorf("lease expired before it could be renewed: %w", api.ErrHalt)

// leaseTick is how often the lease keepers look at this node's runs.
// Short ticks: an operator may lower a behavior's lease at runtime (to 1 s
// at least), and a tick only scans this node's runs.
func (s *Server) leaseTick() time.Duration {
	return min(max(s.minLease/6, 50*time.Millisecond), 250*time.Millisecond)
}

// expiryLoop cancels the runs whose lease ran out locally (it could not be
// renewed in time) or whose activity timed out. It touches no database,
// so that nothing another node or a slow statement does can hold it up:
// "ctx is cancelled when the lease is lost" holds even when the database
// does not answer.
func (s *Server) expiryLoop(ctx context.Context) {
	t := time.NewTicker(s.leaseTick())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.expireRuns(time.Now())
	}
}

// leaseLoop renews the leases of this node's runs in one statement once a
// third of a lease has passed (all of them when the node listens again:
// see Server.Start), cancels runs whose lease was lost, drops
// released leases and renews the node's heartbeat. Takeovers of other
// nodes' leases run in a loop of their own (takeoverLoop): their locks are
// never this loop's to wait for.
func (s *Server) leaseLoop(ctx context.Context) {
	t := time.NewTicker(s.leaseTick())
	defer t.Stop()
	lastBeat := time.Now()
	for {
		all := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.checkRuns:
			all = true
		}
		s.renewLeases(ctx, all)
		s.releaseLeases(ctx)
		beat := time.Since(lastBeat) >= s.cfg.NodeHeartbeat
		select {
		case <-s.beatNow:
			// An incident started or ended: show it at once.
			beat = true
		default:
		}
		if beat {
			lastBeat = time.Now()
			s.heartbeat(ctx)
		}
	}
}

// dbTimeout bounds the statements of the loops that have no tighter
// bound: a database that stopped answering (a silent network loss) fails
// them, and the loop tries again, rather than waiting forever.
const dbTimeout = 10 * time.Second

// heartbeat renews the node's row with its health (see incidents).
func (s *Server) heartbeat(ctx context.Context) {
	hctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	err := s.st.HeartbeatNode(hctx, s.cfg.Node, s.inc.health())
	if errors.Is(err, api.ErrNotFound) {
		// Dropped as dead while it was paused or cut off: register
		// again, so that operators see it.
		err = s.register(hctx)
	}
	switch {
	case err == nil:
		s.inc.ok(false)
	case ctx.Err() != nil:
	case !s.inc.failed("heartbeat", err):
		s.log.Warn("stint: node heartbeat failed", "err", err)
	}
}

// takeoverLoop takes over expired leases every lease tick, and after a
// failure waits longer each time (up to the poll interval).
func (s *Server) takeoverLoop(ctx context.Context) {
	failures := 0
	for {
		d := s.leaseTick()
		if failures > 0 {
			d = max(d, spi.Backoff(d, max(d, s.cfg.PollInterval), failures))
		}
		sleep(ctx, d)
		if ctx.Err() != nil {
			return
		}
		if s.takeOver(ctx) {
			failures = 0
		} else {
			failures++
		}
	}
}

// renewLeases renews the leases of the node's runs that are past a third
// of their lease, or all of them, and halts the runs whose lease is gone
// (their task was taken over, cancelled or removed).
func (s *Server) renewLeases(ctx context.Context, all bool) {
	now := time.Now()
	var due []store.Renewal
	var runs []*run
	earliest := now.Add(time.Hour)
	s.mu.Lock()
	for _, r := range s.running {
		lease := r.lease
		// Runs past their deadline are expiryLoop's to cancel; a renewal
		// could not save them. A run that was cancelled and did not return
		// (it ignores its ctx) is not renewed: its task is taken over
		// after the lease. A run that returned keeps its lease until its
		// end is recorded.
		live := r.ctx.Err() == nil || r.returned
		if left := r.deadline.Sub(now); live && left > 0 && (all || left < lease*2/3) {
			due = append(due, store.Renewal{LeaseRef: r.claimed.LeaseRef, Duration: lease})
			runs = append(runs, r)
			earliest = minTime(earliest, r.deadline)
		}
	}
	s.mu.Unlock()
	if len(due) == 0 {
		return
	}
	// A renewal that returns after the earliest deadline is useless for
	// that run: bound the wait.
	rctx, cancel := context.WithDeadline(ctx, earliest)
	defer cancel()
	sent := time.Now()
	held, err := s.st.Renew(rctx, due)
	if err != nil {
		if ctx.Err() == nil && !s.inc.failed("renew", err) {
			s.log.Warn("stint: lease renewal failed", "tasks", len(due), "err", err)
		}
		return
	}
	s.inc.ok(false)
	s.tel.renewals.Add(ctx, int64(len(held)))
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range runs {
		if held[r.claimed.ID] {
			r.deadline = sent.Add(r.lease)
		} else {
			r.cancel(fmt.Errorf("task %s: %w", r.claimed.ID, api.ErrHalt))
		}
	}
}

// releaseLeases drops the leases whose runs all ended, so that their rows
// do not wait for their expiry and a takeover that finds nothing to do.
func (s *Server) releaseLeases(ctx context.Context) {
	s.mu.Lock()
	released := s.released
	s.released = nil
	s.mu.Unlock()
	if len(released) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	if err := s.st.ReleaseLeases(rctx, released); err != nil && ctx.Err() == nil && !s.inc.failed("release", err) {
		// Harmless: the rows expire and a takeover drops them.
		s.log.Warn("stint: releasing leases failed", "leases", len(released), "err", err)
	}
}

// takeoverBatch caps the expired leases one takeover statement handles.
const takeoverBatch = 100

// takeOver makes the tasks of expired leases (of nodes that died, stalled
// or lost the database for longer than a lease) due again. Every node
// does it on every lease tick: the statement costs one index probe when
// nothing expired, and skips the leases and tasks others hold locked. It
// reports whether the statements succeeded.
func (s *Server) takeOver(ctx context.Context) bool {
	for {
		// The statement waits for no lock; the bound is for a database
		// that does not answer.
		tctx, cancel := context.WithTimeout(ctx, max(s.minLease, 5*time.Second))
		leases, tasks, err := s.st.Takeover(tctx, takeoverBatch)
		cancel()
		if err != nil {
			if ctx.Err() == nil && !s.inc.failed("takeover", err) {
				s.log.Warn("stint: taking over expired leases failed", "err", err)
			}
			return false
		}
		s.inc.ok(false)
		s.tel.tookOver(tasks)
		if tasks > 0 {
			s.log.Info("stint: took over the tasks of expired leases", "leases", leases, "tasks", tasks)
		}
		if leases < takeoverBatch {
			return true
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// expireRuns cancels the runs whose lease ran out by now, and those that
// showed no activity for their behavior's ActivityTimeout: their tasks are
// given back (by a statement of their own, so that this loop waits for
// nothing), due at once for any node.
func (s *Server) expireRuns(now time.Time) {
	var inactive []store.LeaseRef
	s.mu.Lock()
	for _, r := range s.running {
		switch {
		case r.ctx.Err() != nil:
		case !r.deadline.After(now):
			r.cancel(errLeaseExpired)
		case r.reg.Policy.ActivityTimeout > 0 && now.Sub(r.active) >= r.reg.Policy.ActivityTimeout:
			r.cancel(fmt.Errorf("task %s: %w for %s: %w", r.claimed.ID, spi.ErrInactive, r.reg.Policy.ActivityTimeout, api.ErrHalt))
			inactive = append(inactive, r.claimed.LeaseRef)
		}
	}
	s.mu.Unlock()
	if len(inactive) > 0 {
		s.log.Info("stint: gave up runs without activity; their tasks are due again", "tasks", len(inactive))
		go s.unclaim(inactive)
	}
}

// unclaim gives tasks back, due at once behind the tasks that wait. On
// failure their leases expire and a takeover finds them.
func (s *Server) unclaim(refs []store.LeaseRef) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.st.Unclaim(ctx, refs, true); err != nil {
		s.log.Warn("stint: unclaim failed; the tasks are taken over after their lease", "tasks", len(refs), "err", err)
	}
}

// drawLeases draws n leases for a claim (see store.ClaimRequest.Leases).
func drawLeases(n int) [][16]byte {
	out := make([][16]byte, n)
	for i := range out {
		_, _ = rand.Read(out[i][:])
		out[i][6] = out[i][6]&0x0f | 0x40 // a version 4 UUID
		out[i][8] = out[i][8]&0x3f | 0x80
	}
	return out
}

// releaseClaim gives back what a failed claim of req may have committed:
// a claim whose answer was lost or outran its deadline would otherwise
// leave its tasks running on no node until their leases expired. The
// claimers are woken once they are due. On failure the leases expire and
// a takeover finds the tasks.
func (s *Server) releaseClaim(req store.ClaimRequest) {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	if err := s.st.ReleaseClaim(ctx, req); err != nil {
		if !s.inc.failed("release", err) {
			s.log.Warn("stint: releasing a failed claim failed; its tasks, if it took any, are taken over after their lease", "err", err)
		}
		return
	}
	s.wakeClaimer()
}
