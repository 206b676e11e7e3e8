package impl_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/store"
)

// TestGetSaysWhyADueTaskWaitsOnNodes: a due task that no claim takes as
// things stand says why in Get's Task.Waiting: no live node runs its
// behavior (and which nodes run what; a node whose heartbeat is old does
// not count), its behavior is paused, or every node that runs it is full.
// A task that a node can take says nothing.
func TestGetSaysWhyADueTaskWaitsOnNodes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	require.NoError(t, e.st.RegisterNode(e.ctx, store.Node{ID: "node-other", Host: "h", PID: 1, MaxWorkers: 4,
		Behaviors: []api.BehaviorID{"cleanup", "report.build"}}))
	require.NoError(t, e.st.RegisterNode(e.ctx, store.Node{ID: "node-gone", Host: "h", PID: 2, MaxWorkers: 4,
		Behaviors: []api.BehaviorID{workKind.ID}}))
	_, err := e.pool.Exec(e.ctx, `UPDATE stint_node SET heartbeat_at = now() - interval '10 minutes' WHERE id = 'node-gone'`)
	require.NoError(t, err)

	f, err := api.Submit(e.ctx, c, workKind, WorkParams{Key: "lonely"})
	require.NoError(t, err)
	task, err := c.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, task.Status)
	require.Equal(t, &api.Wait{Reason: api.WaitNoNode, Limit: string(workKind.ID), Detail: "node-other runs cleanup, report.build"}, task.Waiting)
	page, err := c.List(e.ctx, api.Filter{Behavior: workKind.ID})
	require.NoError(t, err)
	require.Nil(t, page.Tasks[0].Waiting, "lists do not look at nodes")

	require.NoError(t, c.Pause(e.ctx, workKind.ID))
	task, err = c.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, &api.Wait{Reason: api.WaitPaused, Limit: string(workKind.ID)}, task.Waiting)
	require.NoError(t, c.Resume(e.ctx, workKind.ID))

	// A node of one worker, busy with a task that blocks: the next waits
	// on it, and says so; once the node is free, nothing is said.
	srv := e.server("node-one", time.Minute, func(cfg *impl.ServerConfig) {
		cfg.MaxWorkers = 1
		cfg.Behaviors = []api.BehaviorID{demo.Echo.ID}
	})
	blocker, err := api.Submit(e.ctx, c, demo.Echo, demo.EchoParams{Text: "block", DelayMS: 60000})
	require.NoError(t, err)
	waitFor(t, time.Minute, "the blocker to run", func() bool {
		task, err := c.Get(e.ctx, blocker.ID())
		require.NoError(t, err)
		return task.Status == api.StatusRunning
	})
	next, err := api.Submit(e.ctx, c, demo.Echo, demo.EchoParams{Text: "next"})
	require.NoError(t, err)
	task, err = c.Get(e.ctx, next.ID())
	require.NoError(t, err)
	require.Equal(t, &api.Wait{Reason: api.WaitNodesFull, Limit: string(demo.Echo.ID), Detail: "node-one runs 1 of 1"}, task.Waiting)
	// The removal halts the blocker through the server's listener.
	waitFor(t, 10*time.Second, "the server to listen", func() bool { return impl.Listening(srv) })
	require.NoError(t, srv.Remove(e.ctx, blocker.ID()))
	_, err = next.Await(e.ctx)
	require.NoError(t, err)

	later, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: demo.Echo.ID, Params: []byte(`{"text":"later"}`), Delay: time.Hour})
	require.NoError(t, err)
	task, err = c.Get(e.ctx, later.ID)
	require.NoError(t, err)
	require.Nil(t, task.Waiting, "a task not due waits on nothing")
}
