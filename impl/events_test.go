package impl_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// publishParams are the params of test.publish.
type publishParams struct {
	// Gate makes the run wait, once it published, until the gate of this
	// name opens (openGate).
	Gate string `json:"gate,omitempty"`
	// FailFirst fails the first attempt, retryably, after it published.
	FailFirst bool `json:"fail_first,omitempty"`
	// Silent publishes nothing.
	Silent bool `json:"silent,omitempty"`
}

var publishKind = api.Kind[publishParams, struct{}]{ID: "test.publish"}

// publish is test.publish: it publishes "progress" (its attempt) and,
// on its first attempt, "first".
type publish struct{}

func (publish) Kind() api.Kind[publishParams, struct{}]        { return publishKind }
func (publish) TaskID(ids spi.IDs, _ publishParams) api.TaskID { return ids.Unique() }
func (publish) Policy() spi.Policy {
	return spi.Policy{BackoffMin: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}
}
func (publish) Run(ctx context.Context, rc spi.RunContext, p publishParams) (struct{}, error) {
	if p.Silent {
		return struct{}{}, nil
	}
	if err := rc.SetEvent(ctx, "progress", map[string]int{"attempt": rc.Attempt()}); err != nil {
		return struct{}{}, err
	}
	if rc.Attempt() == 1 {
		if err := rc.SetEvent(ctx, "first", "seen"); err != nil {
			return struct{}{}, err
		}
		if p.FailFirst {
			return struct{}{}, api.Retryable("once", "the first attempt fails")
		}
	}
	if err := rc.SetEvent(ctx, "bad key!", 1); err == nil {
		return struct{}{}, api.Permanent("unchecked", "a bad key was taken")
	}
	if p.Gate != "" {
		if err := passGate(ctx, p.Gate); err != nil {
			return struct{}{}, err
		}
	}
	return struct{}{}, nil
}

// TestEventsAreAwaitedBeforeTheTaskEnds: a running task's event is
// awaited and read from another process while the task runs on; it
// outlives the task's retries, is listed by Get, and goes with the task.
func TestEventsAreAwaitedBeforeTheTaskEnds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second, func(cfg *impl.ServerConfig) { spi.MustRegister[publishParams, struct{}](cfg.Registry, publish{}) })
	c := e.client()
	g := newGate(t)
	f, err := api.Submit(e.ctx, srv, publishKind, publishParams{Gate: g, FailFirst: true})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	ev, err := c.AwaitEvent(ctx, f.ID(), "first")
	require.NoError(t, err)
	require.JSONEq(t, `"seen"`, string(ev.Value))
	waitFor(t, time.Minute, "the second attempt's progress", func() bool {
		ev, err := c.GetEvent(e.ctx, f.ID(), "progress")
		var v struct{ Attempt int }
		return err == nil && json.Unmarshal(ev.Value, &v) == nil && v.Attempt == 2
	})
	task, err := c.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, api.StatusRunning, task.Status, "the events came while the task runs")
	require.Len(t, task.Events, 2, "the first attempt's event outlives its failure")
	require.Equal(t, []string{"first", "progress"}, []string{task.Events[0].Key, task.Events[1].Key})

	openGate(g)
	_, err = f.Await(e.ctx)
	require.NoError(t, err)
	require.NoError(t, c.Remove(e.ctx, f.ID()))
	require.Zero(t, e.count(`SELECT count(*) FROM stint_event`), "events go with their task")
}

// TestEventsRefuseWhatTheyMust: a stale lease sets nothing; an event
// never set, of a task that ended without it or of no task, is not
// found; bad keys are refused.
func TestEventsRefuseWhatTheyMust(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second, func(cfg *impl.ServerConfig) { spi.MustRegister[publishParams, struct{}](cfg.Registry, publish{}) })
	c := e.client()
	f, err := api.Submit(e.ctx, srv, publishKind, publishParams{Silent: true})
	require.NoError(t, err)
	_, err = f.Await(e.ctx)
	require.NoError(t, err)

	err = e.st.SetEvent(e.ctx, nil, store.LeaseRef{ID: f.ID(), Lease: [16]byte{1}}, "late", []byte(`1`))
	require.ErrorIs(t, err, api.ErrHalt, "a stale lease publishes nothing")
	require.Zero(t, e.count(`SELECT count(*) FROM stint_event`))

	_, err = c.AwaitEvent(e.ctx, f.ID(), "progress")
	require.ErrorIs(t, err, api.ErrNotFound, "the task finished without it")
	_, err = c.GetEvent(e.ctx, f.ID(), "progress")
	require.ErrorIs(t, err, api.ErrNotFound)
	_, err = c.AwaitEvent(e.ctx, "no-such-task", "progress")
	require.ErrorIs(t, err, api.ErrNotFound)
	for _, key := range []string{"", "with space", string(make([]byte, 129))} {
		_, err = c.GetEvent(e.ctx, f.ID(), key)
		require.ErrorIs(t, err, api.ErrInvalid, "%q", key)
	}
}
