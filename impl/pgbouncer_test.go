package impl_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store/postgres"
)

func TestThroughPgBouncerInTransactionMode(t *testing.T) {
	t.Parallel()
	pgtest.PgBouncerPath(t)
	for _, mode := range []string{"direct LISTEN", "poll only"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			bouncer := pgtest.StartPgBouncer(t, e.dsn).URL
			opt := postgres.ListenDSN(e.dsn)
			if mode == "poll only" {
				opt = postgres.PollOnly()
			}
			open := func() *postgres.Store {
				st, err := postgres.Open(e.ctx, bouncer, opt)
				require.NoError(t, err)
				t.Cleanup(st.Close)
				return st
			}
			srvStore := open()
			srv, err := impl.NewServer(srvStore, impl.ServerConfig{Registry: testRegistry(e.pool, "bounced", 5*time.Second),
				PollInterval: 100 * time.Millisecond, AwaitPollInterval: 100 * time.Millisecond})
			require.NoError(t, err)
			require.NoError(t, srv.Start(e.ctx))
			t.Cleanup(func() { _ = srv.Stop(context.Background()) })
			client, err := impl.NewClient(open(), impl.ClientConfig{Registry: testRegistry(e.pool, "c", time.Second), PollInterval: 100 * time.Millisecond})
			require.NoError(t, err)
			t.Cleanup(client.Close)

			var futures []*api.Future[WorkResult]
			for i := range 50 {
				f, err := api.Submit(e.ctx, client, workKind, WorkParams{Key: fmt.Sprint(i), FailUntil: i % 2})
				require.NoError(t, err)
				futures = append(futures, f)
			}
			for i, f := range futures {
				res, err := f.Await(e.ctx)
				require.NoError(t, err)
				require.Equal(t, 1+i%2, res.Attempt)
			}
			require.Equal(t, 75, e.count(`SELECT count(*) FROM test_run`))
		})
	}
}
