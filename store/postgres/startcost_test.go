package postgres

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
)

// roundTrips counts the statements and batches sent on a connection, each
// one round trip.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (r *roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// TestAStartingSubmitCostsWhatAPlainOneDoes: a submit that starts its
// task on the submitting node (a server's own, SubmitStart) makes as many
// round trips as a plain one (a client's, Submit): one; its statement is
// planned once per connection as the plain one's is, not anew for every
// submit; and it waits for no lock: with its behavior's cap lock and
// settings row held by other transactions it returns at once, leaving its
// task to the claimers.
func TestAStartingSubmitCostsWhatAPlainOneDoes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := pgtest.New(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	trips := &roundTrips{}
	cfg.ConnConfig.Tracer = trips
	cfg.MaxConns = 1 // one connection: its prepared statements are all of the store's
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		registerArrayCodecs(conn.TypeMap())
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	st := &Store{pool: pool}

	const client, server = "cost.client", "cost.server"
	submitOne := func(id string, start bool) []store.Claimed {
		t.Helper()
		task := store.NewTask{ID: api.TaskID(id), Behavior: client, Params: []byte("{}")}
		if !start {
			_, err := st.Submit(ctx, []store.NewTask{task})
			require.NoError(t, err)
			return nil
		}
		task.Behavior, task.StartLease = server, time.Minute
		_, started, err := st.SubmitStart(ctx, "node", []store.NewTask{task})
		require.NoError(t, err)
		return started
	}
	// Each statement's first call prepares it.
	submitOne("warm-plain", false)
	submitOne("warm-start", true)
	const n = 20
	sent := map[bool]int64{}
	for i := range n {
		for _, start := range []bool{false, true} {
			before := trips.n.Load()
			started := submitOne(fmt.Sprint("t", i, start), start)
			sent[start] += trips.n.Load() - before
			if start {
				require.Len(t, started, 1, "the server's submit started its task")
			}
		}
	}
	require.Equal(t, int64(n), sent[false], "round trips of %d plain submits", n)
	require.Equal(t, sent[false], sent[true], "round trips of %d starting submits", n)

	plans := map[string]int64{}
	rows, err := pool.Query(ctx, `SELECT statement, custom_plans FROM pg_prepared_statements`)
	require.NoError(t, err)
	for rows.Next() {
		var stmt string
		var custom int64
		require.NoError(t, rows.Scan(&stmt, &custom))
		plans[stmt] = custom
	}
	require.NoError(t, rows.Err())
	plain, ok := plans[submitSQL]
	require.True(t, ok, "the plain submit statement is prepared")
	starting, ok := plans[submitStartSQL]
	require.True(t, ok, "the starting submit statement is prepared")
	require.LessOrEqual(t, starting, plain, "custom plans of %d starting submits, against %d of as many plain ones", n+1, plain)

	// Another transaction holds the cap lock of the server's behavior (as
	// SetConcurrencyLimit does) and its settings row (as a pause does).
	_, err = pool.Exec(ctx, `INSERT INTO stint_behavior (behavior) VALUES ($1)`, server)
	require.NoError(t, err)
	other, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer other.Close(context.WithoutCancel(ctx))
	tx, err := other.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('stint.cap:' || $1, 0))`, server)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM stint_behavior WHERE behavior = $1 FOR UPDATE`, server)
	require.NoError(t, err)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	task := store.NewTask{ID: "held", Behavior: server, Params: []byte("{}"), StartLease: time.Minute}
	subs, started, err := st.SubmitStart(wctx, "node", []store.NewTask{task})
	require.NoError(t, err, "the starting submit waited for a lock")
	require.Empty(t, started)
	require.Equal(t, api.StatusScheduled, subs[0].Status)
}
