package impl

import (
	"context"
	mrand "math/rand/v2"
	"time"

	"github.com/stinthq/stint/store"
)

// Maintenance tunes a server's upkeep. Zero fields take the defaults.
type Maintenance struct {
	// Interval is the time between rounds. Defaults to 30 seconds.
	Interval time.Duration
	// ConsumerTimeout drops feed consumers that did not ack for this long.
	// Defaults to 10 minutes.
	ConsumerTimeout time.Duration
	// FeedMinRetention keeps every change this long, read or not: how long
	// a reader that does not ack (Changes or ReadFeed from a stored
	// cursor, the events stream's since) may be away and miss nothing; a
	// consumer that acks (Client.AckChanges) has the feed kept for it up
	// to FeedMaxRetention. Defaults to 10 minutes. The feed takes a few
	// hundred bytes a task, about 11 MB a minute at 300 tasks a second:
	// some 110 MB at that rate by default.
	FeedMinRetention time.Duration
	// FeedMaxRetention drops changes this old even if a live consumer did
	// not read them. Defaults to 7 days.
	FeedMaxRetention time.Duration
	// NodeTimeout drops nodes whose heartbeat is this old: they died
	// without deregistering. Defaults to ten node heartbeats.
	NodeTimeout time.Duration
	// Batch caps the changes one statement trims from the feed; a round
	// trims batches until one comes back short. Defaults to 10,000.
	Batch int
	// HistoryInterval is how often the node adds the runs that ended on
	// it to the dashboard's history in the database, and offers to sample
	// the backlog and queue lag (one node per 10 seconds does; a minute
	// keeps the largest of its samples). Defaults to 10 seconds.
	HistoryInterval time.Duration
}

func (m Maintenance) withDefaults() Maintenance {
	if m.Interval <= 0 {
		m.Interval = 30 * time.Second
	}
	if m.ConsumerTimeout <= 0 {
		m.ConsumerTimeout = 10 * time.Minute
	}
	if m.FeedMinRetention <= 0 {
		m.FeedMinRetention = DefaultFeedMinRetention
	}
	if m.FeedMaxRetention <= 0 {
		m.FeedMaxRetention = 7 * 24 * time.Hour
	}
	if m.Batch <= 0 {
		m.Batch = 10_000
	}
	if m.HistoryInterval <= 0 {
		m.HistoryInterval = 10 * time.Second
	}
	return m
}

// DefaultFeedMinRetention is Maintenance.FeedMinRetention's default.
const DefaultFeedMinRetention = 10 * time.Minute

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
