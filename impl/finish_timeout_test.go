package impl_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
)

// TestAFinishThatOutrunsItsDeadlineGetsLonger: a finish that takes longer
// than its deadline (here, one blocked by a lock held until it has waited
// three times its first deadline) is tried again with twice the deadline
// each time, and is recorded; tried with the same deadline, it never
// would be (as a finish that wakes 100,000 dependents on a busy database
// was not).
func TestAFinishThatOutrunsItsDeadlineGetsLonger(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", time.Minute)
	const first = 200 * time.Millisecond
	impl.SetFinishTimeout(srv, first)

	g := newGate(t)
	sub, err := srv.Submit(e.ctx, workReq(workKind, WorkParams{Key: "slow-finish", Gate: g}))
	require.NoError(t, err)
	waitFor(t, time.Minute, "the run starts", func() bool { return get(t, srv, sub.ID).Status == api.StatusRunning })

	// Hold the task's row, then let the run end: its finish waits for the
	// row. Let the row go once a finish statement has waited 3x first.
	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(e.ctx, `SELECT 1 FROM stint_task WHERE id = $1 FOR UPDATE`, string(sub.ID))
	require.NoError(t, err)
	openGate(g)
	waitFor(t, time.Minute, "a finish waits for the row longer than 3x its first deadline", func() bool {
		var n int
		require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND state = 'active' AND query ~ ('UPDATE ' || 'stint_task')
			  AND clock_timestamp() - query_start > $1`, 3*first).Scan(&n))
		return n > 0
	})
	require.NoError(t, tx.Rollback(e.ctx))
	waitFor(t, time.Minute, "the run is recorded", func() bool { return get(t, srv, sub.ID).Status == api.StatusSuccess })
}
