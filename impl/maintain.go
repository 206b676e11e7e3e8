package impl

import (
	"context"
	mrand "math/rand/v2"
	"time"

	"github.com/stinthq/stint/store"
)

// maintainTimeout bounds one statement of the upkeep.
const maintainTimeout = time.Minute

// maintainLoop runs the upkeep every server does: it drops dead feed
// consumers and nodes and trims the change feed, a batch at a time until
// one comes back short. Every node runs it; the statements are idempotent.
func (s *Server) maintainLoop(ctx context.Context) {
	m := s.cfg.Maintenance
	for {
		sleep(ctx, m.Interval/2+time.Duration(mrand.Int64N(int64(m.Interval))))
		if ctx.Err() != nil {
			return
		}
		var total store.MaintainResult
		for {
			mctx, cancel := context.WithTimeout(ctx, maintainTimeout)
			res, err := s.st.Maintain(mctx, store.MaintainParams{
				ConsumerTimeout:  m.ConsumerTimeout,
				NodeTimeout:      m.NodeTimeout,
				FeedMinRetention: m.FeedMinRetention,
				FeedMaxRetention: m.FeedMaxRetention,
				Batch:            m.Batch,
			})
			cancel()
			if err != nil {
				if ctx.Err() == nil && !s.inc.failed("maintain", err) {
					s.log.Warn("stint: maintenance failed", "err", err)
				}
				break
			}
			total.Consumers += res.Consumers
			total.Nodes += res.Nodes
			total.Changes += res.Changes
			if res.Changes < m.Batch {
				break
			}
		}
		if total != (store.MaintainResult{}) {
			s.log.Info("stint: maintenance", "dropped_consumers", total.Consumers, "dropped_nodes", total.Nodes, "trimmed_changes", total.Changes)
		}
	}
}
