package network

import (
	"context"
	"github.com/stinthq/stint/internal/chaos"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// lockedKind's runs wait for the advisory lock lockedKey ignoring their
// cancellation, as a run blocked in a statement that does not heed its
// context.
var lockedKind = api.Kind[chaos.WorkParams, string]{ID: "chaos.locked"}

const lockedKey = 7_340_034

type locked struct{ pool *pgxpool.Pool }

func (locked) Kind() api.Kind[chaos.WorkParams, string]          { return lockedKind }
func (locked) TaskID(ids spi.IDs, p chaos.WorkParams) api.TaskID { return ids.Deterministic(p.N) }
func (l locked) Run(ctx context.Context, rc spi.RunContext, p chaos.WorkParams) (string, error) {
	_, err := l.pool.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_xact_lock($1)`, lockedKey)
	return "", err
}

// TestStopAndCloseEnd stops a server and closes its store while its
// connections are dead (the path blackholed), half-open (the path back
// for new connections only) or blocked in a lock by a run that ignores
// its cancellation, and checks that Server.Stop returns by its context's
// deadline and Store.Close a few seconds after.
func TestStopAndCloseEnd(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(p *chaos.Proxy, st *postgres.Store, c *chaos.Cluster)
	}{
		{"dead", func(p *chaos.Proxy, _ *postgres.Store, _ *chaos.Cluster) { p.Blackhole() }},
		{"half-open", func(p *chaos.Proxy, _ *postgres.Store, _ *chaos.Cluster) { p.Blackhole(); p.Restore(true) }},
		{"locked", func(_ *chaos.Proxy, _ *postgres.Store, c *chaos.Cluster) {
			tx, err := c.Pool.Begin(c.Ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			_, err = tx.Exec(c.Ctx, `SELECT pg_advisory_xact_lock($1)`, lockedKey)
			require.NoError(t, err)
			_, err = c.Client.Submit(c.Ctx, api.SubmitRequest{Behavior: lockedKind.ID, Params: []byte(`{"n":1}`)})
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				var waiting bool
				err := c.Pool.QueryRow(c.Ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)`).Scan(&waiting)
				return err == nil && waiting
			}, time.Minute, 20*time.Millisecond, "the run should wait for the lock")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := chaos.NewCluster(t)
			p := c.BehindProxy()
			st, err := postgres.Open(c.Ctx, c.Nodes[0].DSN)
			require.NoError(t, err)
			reg := spi.NewRegistry()
			spi.MustRegister[chaos.WorkParams, string](reg, chaos.Work{Pool: st.Pool(), Node: "stopping", Lease: spi.DefaultLease})
			spi.MustRegister[chaos.WorkParams, string](reg, locked{pool: st.Pool()})
			srv, err := impl.NewServer(st, impl.ServerConfig{Node: "stopping", Registry: reg, MaxWorkers: 20,
				PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			require.NoError(t, err)
			require.NoError(t, srv.Start(c.Ctx))
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				next := 0
				chaos.Every(stop, 0, 50*time.Millisecond, func() { c.SubmitFrom(next, 10); next += 10 })
			})
			defer func() { close(stop); wg.Wait() }()
			require.Eventually(t, func() bool {
				var n int
				err := c.Pool.QueryRow(c.Ctx, `SELECT count(*) FROM chaos_run WHERE node = 'stopping' AND ended IS NOT NULL`).Scan(&n)
				return err == nil && n > 0
			}, time.Minute, 20*time.Millisecond, "the server should run tasks")
			tc.fault(p, st, c)
			// Statements in flight on the dead path, claims, renewals
			// and runs among them: the fault's duration before the stop.
			time.Sleep(2 * time.Second)
			const grace = 3 * time.Second
			ctx, cancel := context.WithTimeout(context.Background(), grace)
			defer cancel()
			began := time.Now()
			_ = srv.Stop(ctx)
			stopped := time.Since(began)
			st.Close()
			closed := time.Since(began) - stopped
			t.Logf("measured: %s: Stop took %s (its context: %s), Close %s", tc.name, stopped.Round(time.Millisecond), grace, closed.Round(time.Millisecond))
			// Room for a busy machine to notice the deadline.
			require.Less(t, stopped, grace+time.Second, "Stop should return by its context's deadline")
			require.Less(t, closed, 5*time.Second, "Close should return within a few seconds")
			require.Zero(t, st.Pool().Stat().TotalConns(), "Close should have closed every connection")
		})
	}
}
