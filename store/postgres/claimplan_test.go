package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
)

// A claim walks the claim index however many hints are due and whatever
// the statistics say. Here the table was filled and never analyzed, as a
// queue filled faster than autovacuum analyzes it: without the claim's
// settings the planner reads and sorts every due hint. (The merge of the
// behaviors' first hints sorts those few; that sort stays.)
func TestClaimWalksTheIndexWithoutStatistics(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := Open(ctx, pgtest.New(t))
	require.NoError(t, err)
	defer st.Close()
	_, err = st.pool.Exec(ctx, `ALTER TABLE stint_due SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	submitNoop(t, ctx, st, 20000)
	claimPlan := func(settings bool) string {
		tx, err := st.pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // the claim is explained, not kept
		if settings {
			_, err = tx.Exec(ctx, claimSettingsSQL)
			require.NoError(t, err)
		}
		return plan(t, ctx, tx, "COSTS OFF", claimSQL, "n", []string{"bench.noop"}, []int64{30e6}, 1000, int64(0), uuidArray(nil))
	}
	require.NotContains(t, claimPlan(false), "Index Scan using stint_due_order on stint_due c",
		"without the settings the planner reads every due hint: this test no longer shows what the settings are for")
	p := claimPlan(true)
	require.Contains(t, p, "Index Scan using stint_due_order on stint_due c", p)
	require.NotContains(t, p, "Bitmap Heap Scan on stint_due c", p)
	require.NotContains(t, p, "Seq Scan on stint_due c", p)
}
