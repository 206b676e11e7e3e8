package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// The hot statements turn sequential scans off for their own transaction
// only, in every query mode the store supports: a statement on the pool
// leaves the connection's session as it was, and one in a caller's
// transaction gives the transaction its setting back, whichever it was.
func TestSeqscanSettingStaysInItsStatement(t *testing.T) {
	t.Parallel()
	inEachQueryMode(t, func(t *testing.T, ctx context.Context, st *postgres.Store, mode string) {
		seqscan := func(q interface {
			QueryRow(context.Context, string, ...any) pgx.Row
		}) string {
			var v string
			require.NoError(t, q.QueryRow(ctx, `SELECT current_setting('enable_seqscan')`).Scan(&v))
			return v
		}
		id := api.TaskID("seqscan-" + mode)
		_, err := st.Submit(ctx, []store.NewTask{{ID: id, Behavior: semBehavior, Priority: 5}})
		require.NoError(t, err)
		_, err = st.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, "on", seqscan(st.Pool()), "a statement on the pool left its setting on the connection")
		for _, caller := range []string{"on", "off"} {
			tx, err := st.Pool().Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx) //nolint:errcheck // committed below unless the test failed
			_, err = tx.Exec(ctx, `SELECT set_config('enable_seqscan', $1, true)`, caller)
			require.NoError(t, err)
			_, err = st.SubmitTx(ctx, tx, []store.NewTask{{ID: api.TaskID("seqscan-tx-" + caller + mode), Behavior: semBehavior, Priority: 5}})
			require.NoError(t, err)
			require.Equal(t, caller, seqscan(tx), "a statement in the caller's transaction changed its setting")
			require.NoError(t, tx.Commit(ctx))
		}
		require.Equal(t, "on", seqscan(st.Pool()))
	})
}
