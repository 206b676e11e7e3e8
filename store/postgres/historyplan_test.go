package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
)

// Reading the last hour of the history and trimming it past its retention
// walk the primary key, on a full day of 50 behaviors' points never
// analyzed.
func TestHistoryWalksItsPrimaryKey(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := Open(ctx, pgtest.New(t))
	require.NoError(t, err)
	defer st.Close()
	_, err = st.pool.Exec(ctx, `ALTER TABLE stint_history SET (autovacuum_enabled = false);
		INSERT INTO stint_history (bucket, behavior, succeeded, due, lag_us)
		SELECT date_bin('60 seconds', now(), timestamptz 'epoch') - m * interval '1 minute', 'b' || b, 1, 1, 1
		FROM generate_series(0, 1439) m, generate_series(1, 50) b;
		INSERT INTO stint_history_sample (bucket)
		SELECT date_bin('60 seconds', now(), timestamptz 'epoch') - m * interval '1 minute' FROM generate_series(0, 1439) m`)
	require.NoError(t, err)
	tx, err := st.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // explained, not kept
	_, err = tx.Exec(ctx, historySettingsSQL)
	require.NoError(t, err)
	for _, c := range []struct {
		sql, index string
		args       []any
	}{
		{historyReadSQL, "stint_history_pkey", []any{time.Now().Add(-time.Hour)}},
		{historyTrimSQL, "stint_history_pkey", []any{historyRetention}},
		{historySampleTrimSQL, "stint_history_sample_pkey", []any{historyRetention}},
	} {
		p := plan(t, ctx, tx, "COSTS OFF", c.sql, c.args...)
		require.Contains(t, p, c.index, p)
		require.NotContains(t, p, "Seq Scan", p)
	}
}
