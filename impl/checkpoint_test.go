package impl_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

var cancelledKind = api.Kind[KeyParams, struct{}]{ID: "test.cancelled-checkpoint"}

// cancelledCheckpointer checkpoints {"step":1} with a context the test
// cancels while the write waits, then {"step":2} with the run's context,
// as a behavior's worker goroutines do when one fails and the others are
// cancelled while the run goes on to record the failure.
type cancelledCheckpointer struct {
	started chan context.CancelFunc // the cancel of the first checkpoint's context, to the test
	proceed chan struct{}           // closed by the test once it holds the task's row
	first   chan error              // the first checkpoint's error, to the test
}

func (b *cancelledCheckpointer) Kind() api.Kind[KeyParams, struct{}] { return cancelledKind }
func (b *cancelledCheckpointer) TaskID(ids spi.IDs, p KeyParams) api.TaskID {
	return ids.Deterministic(p.Key)
}
func (b *cancelledCheckpointer) Policy() spi.Policy { return spi.Policy{Lease: time.Minute} }

func (b *cancelledCheckpointer) Run(ctx context.Context, rc spi.RunContext, _ KeyParams) (struct{}, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b.started <- cancel
	<-b.proceed
	b.first <- rc.Checkpoint(wctx, map[string]int{"step": 1})
	return struct{}{}, rc.Checkpoint(ctx, map[string]int{"step": 2})
}

// A checkpoint whose context is cancelled while its write waits on the
// server is not abandoned: the call returns once the write has landed, so
// it cannot land after a later checkpoint of the same run and put the
// older progress back.
func TestCheckpointCancelledInFlightLandsBeforeTheNextOne(t *testing.T) {
	t.Parallel()
	e := setup(t)
	b := &cancelledCheckpointer{started: make(chan context.CancelFunc, 1), proceed: make(chan struct{}), first: make(chan error, 1)}
	reg := spi.NewRegistry()
	spi.MustRegister[KeyParams, struct{}](reg, b)
	srv := e.server("node", time.Minute, func(cfg *impl.ServerConfig) { cfg.Registry = reg })
	f, err := api.Submit(e.ctx, srv, cancelledKind, KeyParams{Key: "k"})
	require.NoError(t, err)
	cancel := <-b.started

	// The test holds the task's row, so the first checkpoint waits on
	// the server until the test lets it go.
	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(e.ctx) }()
	_, err = tx.Exec(e.ctx, `SELECT 1 FROM stint_task WHERE id = $1 FOR UPDATE`, string(f.ID()))
	require.NoError(t, err)
	close(b.proceed)
	waitFor(t, 20*time.Second, "the checkpoint to wait for the row", func() bool {
		return e.count(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%SET progress%'`) == 1
	})
	cancel()
	require.NoError(t, tx.Commit(e.ctx))

	require.NoError(t, <-b.first, "the cancelled checkpoint was under way: it lands and says so")
	_, err = f.Await(e.ctx)
	require.NoError(t, err)
	task, err := srv.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.JSONEq(t, `{"step":2}`, string(task.Progress))
}
