package impl

import (
	"context"
	"time"

	"github.com/stinthq/stint/store"
)

// historyLoop records this node's run ends in the database's history every
// Maintenance.HistoryInterval, and offers to sample the backlog: one node
// per 10 seconds takes the sample, and each minute keeps the largest (see
// store.Store.RecordHistory). The counts
// are kept in memory between records, so a run costs an atomic add, not a
// write; a record that fails is retried with the counts of the next one.
func (s *Server) historyLoop(ctx context.Context) {
	for {
		sleep(ctx, s.cfg.Maintenance.HistoryInterval)
		if ctx.Err() != nil {
			return
		}
		hctx, cancel := context.WithTimeout(ctx, dbTimeout)
		if err := s.recordHistory(hctx, true); err != nil && ctx.Err() == nil && !s.inc.failed("history", err) {
			s.log.Warn("stint: recording the history failed", "err", err)
		}
		cancel()
	}
}

// recordHistory writes the run ends counted since the last record; with
// sample, it also offers to sample the backlog.
func (s *Server) recordHistory(ctx context.Context, sample bool) error {
	type pending struct {
		bt                         *behaviorTelemetry
		succeeded, failed, retried int64
	}
	var counts []store.HistoryCount
	var recorded []pending
	s.tel.perBehavior.Range(func(_, v any) bool {
		bt := v.(*behaviorTelemetry)
		p := pending{bt: bt, succeeded: bt.ends.succeeded.Load(), failed: bt.ends.failed.Load(), retried: bt.ends.retried.Load()}
		c := store.HistoryCount{Behavior: bt.id, Succeeded: p.succeeded - bt.recorded.succeeded,
			Failed: p.failed - bt.recorded.failed, Retried: p.retried - bt.recorded.retried}
		if c.Succeeded != 0 || c.Failed != 0 || c.Retried != 0 {
			counts = append(counts, c)
			recorded = append(recorded, p)
		}
		return true
	})
	if len(counts) == 0 && !sample {
		return nil
	}
	if _, err := s.st.RecordHistory(ctx, store.HistoryRecord{Counts: counts, Sample: sample, Behaviors: s.behaviorIDs()}); err != nil {
		return err
	}
	for _, p := range recorded {
		p.bt.recorded.succeeded, p.bt.recorded.failed, p.bt.recorded.retried = p.succeeded, p.failed, p.retried
	}
	return nil
}

// recordLastHistory records the run ends not yet recorded when the server
// stops, so that a restart loses none.
func (s *Server) recordLastHistory() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.recordHistory(ctx, false); err != nil {
		s.log.Warn("stint: recording the history failed", "err", err)
	}
}
