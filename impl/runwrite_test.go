package impl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

var cancelledKind = api.Kind[KeyParams, struct{}]{ID: "test.cancelled-write"}

// cancelledWriter makes write 1 with a context the test cancels while the
// write waits, then write 2 with the run's context, as a behavior's worker
// goroutines do when one fails and the others are cancelled while the run
// goes on to record the failure.
type cancelledWriter struct {
	write   func(ctx context.Context, rc spi.RunContext, step int) error
	started chan context.CancelFunc // the cancel of the first write's context, to the test
	proceed chan struct{}           // closed by the test once it holds the task's row
	first   chan error              // the first write's error, to the test
}

func (b *cancelledWriter) Kind() api.Kind[KeyParams, struct{}] { return cancelledKind }
func (b *cancelledWriter) TaskID(ids spi.IDs, p KeyParams) api.TaskID {
	return ids.Deterministic(p.Key)
}
func (b *cancelledWriter) Policy() spi.Policy { return spi.Policy{Lease: time.Minute} }

func (b *cancelledWriter) Run(ctx context.Context, rc spi.RunContext, _ KeyParams) (struct{}, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b.started <- cancel
	<-b.proceed
	b.first <- b.write(wctx, rc, 1)
	return struct{}{}, b.write(ctx, rc, 2)
}

// A write of a run (a checkpoint, a priority, children) whose context is
// cancelled while it waits on the server is not abandoned: the call returns
// once the write has landed, so it cannot land after a later write of the
// same run and put the older value back.
func TestRunWriteCancelledInFlightLandsBeforeTheNextOne(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		write func(ctx context.Context, rc spi.RunContext, step int) error
		query string // a pattern of the write's statement in pg_stat_activity
		check func(t *testing.T, e *env, task api.Task)
	}{{
		name: "checkpoint",
		write: func(ctx context.Context, rc spi.RunContext, step int) error {
			return rc.Checkpoint(ctx, map[string]int{"step": step})
		},
		query: "%SET progress%",
		check: func(t *testing.T, _ *env, task api.Task) {
			require.JSONEq(t, `{"step":2}`, string(task.Progress))
		},
	}, {
		name: "set priority",
		write: func(ctx context.Context, rc spi.RunContext, step int) error {
			return rc.SetPriority(ctx, 100+step)
		},
		query: "%SET priority%",
		check: func(t *testing.T, _ *env, task api.Task) {
			require.Equal(t, 102, task.Priority)
		},
	}, {
		name: "spawn",
		write: func(ctx context.Context, rc spi.RunContext, step int) error {
			params, _ := json.Marshal(demo.EchoParams{Text: fmt.Sprint(step)})
			_, err := rc.Spawn(ctx, api.SubmitRequest{Behavior: demo.Echo.ID, Params: params})
			return err
		},
		query: "%AND lease = $2 AND status = 'running' FOR UPDATE%",
		check: func(t *testing.T, e *env, task api.Task) {
			require.Equal(t, 2, e.count(`SELECT count(*) FROM stint_task WHERE parent_id = $1`, string(task.ID)),
				"both children are stored")
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			b := &cancelledWriter{write: tc.write, started: make(chan context.CancelFunc, 1), proceed: make(chan struct{}), first: make(chan error, 1)}
			reg := spi.NewRegistry()
			spi.MustRegister[KeyParams, struct{}](reg, b)
			require.NoError(t, demo.Register(reg))
			srv := e.server("node", time.Minute, func(cfg *impl.ServerConfig) { cfg.Registry = reg })
			f, err := api.Submit(e.ctx, srv, cancelledKind, KeyParams{Key: "k"})
			require.NoError(t, err)
			cancel := <-b.started

			// The test holds the task's row, so the first write waits on
			// the server until the test lets it go.
			tx, err := e.pool.Begin(e.ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(e.ctx) }()
			_, err = tx.Exec(e.ctx, `SELECT 1 FROM stint_task WHERE id = $1 FOR UPDATE`, string(f.ID()))
			require.NoError(t, err)
			close(b.proceed)
			waitFor(t, 20*time.Second, "the write to wait for the row", func() bool {
				return e.count(`SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`, tc.query) == 1
			})
			cancel()
			require.NoError(t, tx.Commit(e.ctx))

			require.NoError(t, <-b.first, "the cancelled write was under way: it lands and says so")
			_, err = f.Await(e.ctx)
			require.NoError(t, err)
			task, err := srv.Get(e.ctx, f.ID())
			require.NoError(t, err)
			tc.check(t, e, task)
		})
	}
}
