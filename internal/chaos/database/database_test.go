package database

import (
	"context"
	"errors"
	"github.com/stinthq/stint/internal/chaos"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store/postgres"
)

func TestPostgresRestart(t *testing.T) {
	cl := pgtest.Cluster()
	if cl == nil {
		t.Skip("the cluster is not this test binary's (STINT_TEST_DATABASE_URL is set)")
	}
	tasks, faultFor := chaos.Size()
	chaos.Scenario(t, tasks, faultFor, func(c *chaos.Cluster, stop <-chan struct{}) {
		select {
		case <-stop:
			return
		case <-time.After(time.Second):
		}
		require.NoError(t, cl.Restart(c.Ctx))
	})
}

func TestTerminatedBackends(t *testing.T) {
	tasks, faultFor := chaos.Size()
	chaos.Scenario(t, tasks, faultFor, func(c *chaos.Cluster, stop <-chan struct{}) {
		chaos.Every(stop, 300*time.Millisecond, 300*time.Millisecond, func() {
			_, err := c.Pool.Exec(c.Ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
				ORDER BY random() LIMIT 3`)
			if err != nil && !errors.Is(err, context.Canceled) && !strings.Contains(err.Error(), "terminat") {
				t.Logf("terminate backends: %v", err)
			}
		})
	})
}

func TestXminPinnedByALongTransaction(t *testing.T) {
	tasks, faultFor := chaos.Size()
	if !*chaos.Long {
		faultFor = 15 * time.Second
	}
	chaos.Scenario(t, tasks, faultFor, func(c *chaos.Cluster, stop <-chan struct{}) {
		conn, err := pgx.Connect(c.Ctx, c.DSN)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		tx, err := conn.Begin(c.Ctx)
		require.NoError(t, err)
		var xid int64
		require.NoError(t, tx.QueryRow(c.Ctx, `SELECT txid_current()`).Scan(&xid))
		<-stop
		require.NoError(t, tx.Rollback(c.Ctx))
	})
}

func TestWritesRefused(t *testing.T) {
	if pgtest.Cluster() == nil {
		t.Skip("the cluster is not this test binary's (STINT_TEST_DATABASE_URL is set): ALTER SYSTEM would change another server")
	}
	c := chaos.NewCluster(t)
	c.StartAll()
	setReadOnly := func(on bool) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin, err := pgx.Connect(ctx, c.DSN)
		require.NoError(t, err)
		defer admin.Close(ctx)
		q := `ALTER SYSTEM RESET default_transaction_read_only`
		if on {
			q = `ALTER SYSTEM SET default_transaction_read_only = on`
		}
		// The session turning writes on again must itself be able to.
		for _, q := range []string{`SET default_transaction_read_only = off`, q, `SELECT pg_reload_conf()`} {
			_, err := admin.Exec(ctx, q)
			require.NoError(t, err)
		}
	}
	t.Cleanup(func() { setReadOnly(false) })
	var refused error
	c.Incident("writes refused", chaos.IncidentFor(5*time.Second), func() {
		setReadOnly(true)
		require.Eventually(t, func() bool {
			var sub api.Submission
			sub, refused = c.Client.Submit(c.Ctx, api.SubmitRequest{Behavior: chaos.WorkKind.ID, Params: []byte(`{"n":2000000}`)})
			if refused == nil && !slices.Contains(c.Extra, sub.ID) {
				c.Extra = append(c.Extra, sub.ID) // before the reload reached the session
			}
			return refused != nil
		}, time.Minute, 50*time.Millisecond, "a submit should be refused")
	}, func() { setReadOnly(false) }, impl.CauseReadOnly)
	require.ErrorIs(t, refused, api.ErrReadOnly)
	require.ErrorIs(t, refused, api.ErrUnavailable)
	require.ErrorContains(t, refused, "accepts no writes")
	t.Logf("the refused submit's error: %v", refused)
}

func TestPgBouncerRestart(t *testing.T) {
	pgtest.PgBouncerPath(t) // installs PgBouncer, or skips, before the deadlines start
	c := chaos.NewCluster(t)
	bouncer := pgtest.StartPgBouncer(t, c.DSN)
	for _, n := range c.Nodes {
		// Transaction mode cannot carry LISTEN: the nodes listen on a
		// direct connection.
		n.DSN, n.Listen = bouncer.URL, c.DSN
	}
	c.StartAll()
	// The workload's client submits through PgBouncer too.
	st, err := postgres.Open(c.Ctx, bouncer.URL, postgres.ListenDSN(c.DSN))
	require.NoError(t, err)
	t.Cleanup(st.Close)
	c.Client, err = impl.NewClient(st, impl.ClientConfig{Registry: chaos.Registry(st.Pool(), "client")})
	require.NoError(t, err)
	t.Cleanup(c.Client.Close)
	c.Incident("PgBouncer restart", chaos.IncidentFor(2*time.Second), bouncer.Kill, bouncer.Restart, impl.CauseUnreachable)
}
