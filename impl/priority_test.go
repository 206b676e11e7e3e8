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

// prioritizer sets its own task's priority: a bad one, then 9, then, once
// told to, 2; it reports each call's error.
type prioritizer struct {
	started chan struct{}
	proceed chan struct{}
	errs    chan error
}

func (p *prioritizer) Kind() api.Kind[KeyParams, struct{}] {
	return api.Kind[KeyParams, struct{}]{ID: "test.prioritizer"}
}
func (p *prioritizer) TaskID(ids spi.IDs, k KeyParams) api.TaskID { return ids.Deterministic(k.Key) }
func (p *prioritizer) Run(ctx context.Context, rc spi.RunContext, _ KeyParams) (struct{}, error) {
	p.errs <- rc.SetPriority(ctx, -1)
	p.errs <- rc.SetPriority(ctx, 9)
	close(p.started)
	select {
	case <-p.proceed:
	case <-ctx.Done():
		return struct{}{}, context.Cause(ctx)
	}
	err := rc.SetPriority(ctx, 2)
	p.errs <- err
	return struct{}{}, err
}

// TestRunSetsItsPriorityFenced: a run changes its own task's priority; a
// bad priority changes nothing; a run whose lease is no longer the task's
// (another claim took the task) changes nothing and gets api.ErrHalt.
func TestRunSetsItsPriorityFenced(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := &prioritizer{started: make(chan struct{}), proceed: make(chan struct{}), errs: make(chan error, 3)}
	reg := spi.NewRegistry()
	spi.MustRegister[KeyParams, struct{}](reg, p)
	srv := e.server("node", time.Minute, func(cfg *impl.ServerConfig) { cfg.Registry = reg })
	sub, err := srv.Submit(e.ctx, api.SubmitRequest{Behavior: "test.prioritizer", Params: []byte(`{"key":"k"}`)})
	require.NoError(t, err)
	select {
	case <-p.started:
	case <-e.ctx.Done():
		t.Fatal("the run did not start")
	}
	require.ErrorIs(t, <-p.errs, api.ErrInvalid)
	require.NoError(t, <-p.errs)
	task, err := srv.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, 9, task.Priority)

	// Another claim's lease replaces the run's.
	_, err = e.pool.Exec(e.ctx, `UPDATE stint_task SET lease = gen_random_uuid() WHERE id = $1`, string(sub.ID))
	require.NoError(t, err)
	close(p.proceed)
	require.ErrorIs(t, <-p.errs, api.ErrHalt)
	task, err = srv.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, 9, task.Priority, "the stale run changed nothing")
}
