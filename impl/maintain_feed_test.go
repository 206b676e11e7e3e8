package impl_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/impl"
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
