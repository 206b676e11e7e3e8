package impl_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/store"
)

// TestTheFeedKeepsTenMinutesByDefault: with no feed consumer, the servers'
// upkeep at its default retention trims the changes older than ten
// minutes and keeps the younger ones (an hour of feed took about 1.5 GB
// at 1,500 tasks a second).
func TestTheFeedKeepsTenMinutesByDefault(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := e.pool.Exec(e.ctx, `INSERT INTO stint_change (task_ids, behaviors, statuses, parent_ids, finals, at) VALUES
		(ARRAY['old'], ARRAY['b'], ARRAY['success'], ARRAY[NULL::text], ARRAY[true], now() - interval '11 minutes'),
		(ARRAY['young'], ARRAY['b'], ARRAY['success'], ARRAY[NULL::text], ARRAY[true], now() - interval '9 minutes')`)
	require.NoError(t, err)
	e.server("a", 5*time.Second, func(cfg *impl.ServerConfig) {
		cfg.Maintenance = impl.Maintenance{Interval: 200 * time.Millisecond}
	})
	kept := func(id string) bool {
		return e.count(`SELECT count(*) FROM stint_change WHERE task_ids = ARRAY[$1]`, id) > 0
	}
	waitFor(t, 30*time.Second, "the change of 11 minutes ago to be trimmed", func() bool { return !kept("old") })
	require.True(t, kept("young"), "the change of 9 minutes ago is kept")
}

// TestATrimSkipsWhatAnotherHolds: every node trims the feed, often at
// once; a trim takes the old changes and ticks another trim does not hold
// and never waits for it (two nodes' deletes of overlapping batches, each
// locking in its own order, deadlocked: "trim feed: deadlock detected").
func TestATrimSkipsWhatAnotherHolds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := e.pool.Exec(e.ctx, `INSERT INTO stint_change (task_ids, behaviors, statuses, parent_ids, finals, at)
		SELECT ARRAY['t' || i], ARRAY['b'], ARRAY['success'], ARRAY[NULL::text], ARRAY[true], now() - interval '2 hours'
		FROM generate_series(1, 100) i`)
	require.NoError(t, err)
	_, err = e.pool.Exec(e.ctx, `INSERT INTO stint_feed_tick (snap, at)
		SELECT pg_current_snapshot(), now() - interval '2 hours' FROM generate_series(1, 10)`)
	require.NoError(t, err)
	// Another node's trim, under way: it holds the oldest changes and ticks.
	other, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(e.ctx) }()
	_, err = other.Exec(e.ctx, `SELECT seq FROM stint_change ORDER BY seq LIMIT 10 FOR UPDATE`)
	require.NoError(t, err)
	_, err = other.Exec(e.ctx, `SELECT tick FROM stint_feed_tick ORDER BY tick LIMIT 3 FOR UPDATE`)
	require.NoError(t, err)

	p := store.MaintainParams{ConsumerTimeout: time.Hour, NodeTimeout: time.Hour, FeedMinRetention: time.Hour,
		FeedMaxRetention: 7 * 24 * time.Hour, Batch: 1000}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	res, err := e.st.Maintain(ctx, p)
	require.NoError(t, err, "the trim waited for the other")
	require.Equal(t, 90, res.Changes)
	require.Equal(t, 3+1, e.count(`SELECT count(*) FROM stint_feed_tick`), "the held ticks and the newest stay")

	require.NoError(t, other.Rollback(e.ctx))
	res, err = e.st.Maintain(e.ctx, p)
	require.NoError(t, err)
	require.Equal(t, 10, res.Changes)
	require.Zero(t, e.count(`SELECT count(*) FROM stint_change`))
}
