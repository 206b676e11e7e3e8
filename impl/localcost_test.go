package impl_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// tripKey marks the context of the submits whose round trips a tripCounter
// counts.
type tripKey struct{}

// tripCounter counts the round trips sent with a context marked by
// tripKey: batches, and statements on stint's tables. A new connection's
// session settings and a statement's prepare, made once per connection,
// are left out: the pool opens connections as it needs them, for either
// side.
type tripCounter struct{ n atomic.Int64 }

func (c *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if ctx.Value(tripKey{}) != nil && strings.Contains(d.SQL, "stint_") {
		c.n.Add(1)
	}
	return ctx
}
func (c *tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	if ctx.Value(tripKey{}) != nil {
		c.n.Add(1)
	}
	return ctx
}
func (c *tripCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *tripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestAServersOwnSubmitCostsWhatAClientsDoes: a server's own submit of a
// due task, which starts it on the server's node (a local start), makes
// as many round trips as a client's submit of the same task (one), and
// locks no table, index or advisory lock beyond a client's but those that
// starting a task needs: its lease row (stint_lease), the check that no
// cap set at runtime binds (stint_concurrency and the cap's shared
// advisory lock), and the claim index (stint_due_order), read for a
// backlog the start must not jump. The locks are those in pg_locks while
// each submit waits for another transaction's insert of the same id:
// every table a statement uses is locked by then.
func TestAServersOwnSubmitCostsWhatAClientsDoes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn := pgtest.New(t)
	trips := &tripCounter{}
	open := func() *postgres.Store {
		st, err := postgres.Open(ctx, dsn, postgres.Tracer(trips))
		require.NoError(t, err)
		t.Cleanup(st.Close)
		return st
	}
	sst, cst := open(), open()
	reg := spi.NewRegistry()
	spi.MustRegister[struct{}, struct{}](reg, noop{})
	srv, err := impl.NewServer(sst, impl.ServerConfig{Node: "cost", Registry: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, srv.Start(ctx))
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		_ = srv.Stop(sctx)
	})
	cli, err := impl.NewClient(cst, impl.ClientConfig{Registry: reg})
	require.NoError(t, err)
	t.Cleanup(cli.Close)

	submit := func(via api.Tasks, id string) (api.Submission, int64) {
		t.Helper()
		before := trips.n.Load()
		sub, err := via.Submit(context.WithValue(ctx, tripKey{}, true), api.SubmitRequest{Behavior: noopKind.ID, ID: api.TaskID(id)})
		require.NoError(t, err)
		return sub, trips.n.Load() - before
	}
	started := 0
	for i := range 20 {
		_, client := submit(cli, fmt.Sprint("client-", i))
		require.Equal(t, int64(1), client, "round trips of a client's submit")
		sub, server := submit(srv, fmt.Sprint("server-", i))
		if sub.Status != api.StatusRunning {
			continue // its slot was held by a claim: it went to the claimers
		}
		started++
		require.Equal(t, client, server, "round trips of the server's own submit, which started its task")
	}
	require.Positive(t, started, "the server's submits started their tasks")

	// The locks each submit holds while it waits for another
	// transaction's insert of its id.
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer admin.Close(context.WithoutCancel(ctx))
	locks := func(via api.Tasks, id string) []string {
		t.Helper()
		blocker, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		defer blocker.Close(context.WithoutCancel(ctx))
		tx, err := blocker.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO stint_task (id, behavior, params, priority, schedule_not_before) VALUES ($1, $2, '{}', 5, now())`, id, string(noopKind.ID))
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := via.Submit(ctx, api.SubmitRequest{Behavior: noopKind.ID, ID: api.TaskID(id)})
			done <- err
		}()
		var pid int32
		require.Eventually(t, func() bool {
			err := admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'transactionid'`).Scan(&pid)
			return err == nil
		}, time.Minute, 5*time.Millisecond, "the submit waits for the other insert")
		rows, err := admin.Query(ctx, `SELECT locktype || coalesce(' ' || relation::regclass::text, '')
			FROM pg_locks WHERE pid = $1 AND granted AND locktype NOT IN ('transactionid', 'virtualxid')`, pid)
		require.NoError(t, err)
		held, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		require.NoError(t, <-done)
		slices.Sort(held)
		return slices.Compact(held)
	}
	clientLocks := locks(cli, "locks-client")
	serverLocks := locks(srv, "locks-server")
	require.Contains(t, clientLocks, "relation stint_task")
	// What starting a task needs: its lease row, the check that no cap
	// set at runtime binds, and a look at the claim index for a backlog
	// it must not jump (planning that look, as a statement not yet
	// cached plans, opens every index of stint_due).
	needed := []string{"relation stint_lease", "relation stint_concurrency", "relation stint_concurrency_pkey", "advisory",
		"relation stint_due_order", "relation stint_due_key"}
	var extra []string
	for _, l := range serverLocks {
		if !slices.Contains(clientLocks, l) && !slices.Contains(needed, l) {
			extra = append(extra, l)
		}
	}
	require.Empty(t, extra, "locks the server's own submit takes beyond a client's (client: %v; server: %v)", clientLocks, serverLocks)
}
