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

// idle is a behavior for the timeouts: a task keyed "hang" blocks without
// a sign of life in its first run, one keyed "busy" checkpoints every 50 ms
// for a while, any other succeeds at once.
type idle struct {
	kind   api.Kind[KeyParams, struct{}]
	policy spi.Policy
	log    *runLog
	busy   time.Duration
}

func (b *idle) Kind() api.Kind[KeyParams, struct{}]        { return b.kind }
func (b *idle) TaskID(ids spi.IDs, p KeyParams) api.TaskID { return ids.Deterministic(p.Key) }
func (b *idle) Policy() spi.Policy                         { return b.policy }
func (b *idle) Run(ctx context.Context, rc spi.RunContext, p KeyParams) (struct{}, error) {
	b.log.start(rc.TaskID())
	n := 0
	b.log.read(func(l *runLog) { n = l.starts[string(rc.TaskID())] })
	var err error
	switch {
	case p.Key == "hang" && n == 1:
		<-ctx.Done()
		err = context.Cause(ctx)
	case p.Key == "busy":
		for end := time.Now().Add(b.busy); time.Now().Before(end) && err == nil; {
			if err = rc.Checkpoint(ctx, n); err == nil {
				err = spi.Sleep(ctx, 50*time.Millisecond)
			}
		}
	}
	b.log.end(n, err)
	return struct{}{}, err
}

func (e *env) idleServer(b *idle) *impl.Server {
	e.t.Helper()
	reg := spi.NewRegistry()
	spi.MustRegister[KeyParams, struct{}](reg, b)
	return e.server("node", b.policy.Lease, func(cfg *impl.ServerConfig) { cfg.Registry = reg })
}

// TestRunTimeoutIsARetryableFailure: a run past Policy.Timeout has its ctx
// cancelled and fails retryably, counted as an attempt, until MaxAttempts.
func TestRunTimeoutIsARetryableFailure(t *testing.T) {
	t.Parallel()
	e := setup(t)
	b := &blocker{kind: api.Kind[KeyParams, struct{}]{ID: "test.timed"}, log: newRunLog(),
		policy: spi.Policy{Timeout: 200 * time.Millisecond, MaxAttempts: 2, BackoffMin: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}}
	srv := e.blockerServer("node", b)
	ids := e.submitKeys(srv, b.kind.ID, "slow")
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	task, err := srv.Await(ctx, ids[0])
	require.NoError(t, err, "the runs must time out")
	require.Equal(t, api.StatusFailure, task.Status)
	require.Equal(t, 2, task.Attempt, "each timed-out run is an attempt")
	require.Equal(t, 2, task.Errors)
	require.NotNil(t, task.Error)
	require.Equal(t, "timeout", task.Error.Code)
	require.Contains(t, task.Error.Message, "timed out after 200ms")
	require.True(t, task.Error.Retryable)
	b.log.read(func(l *runLog) {
		require.Len(t, l.ends, 2)
		for _, cause := range l.ends {
			require.ErrorIs(t, cause, spi.ErrTimeout)
		}
	})
}

// TestActivityTimeout: a run without a checkpoint or heartbeat for
// Policy.ActivityTimeout loses its task, which runs again at once (long
// before its lease would have expired); a run that checkpoints keeps it.
func TestActivityTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const lease, activity = time.Minute, time.Second
	b := &idle{kind: api.Kind[KeyParams, struct{}]{ID: "test.idle"}, log: newRunLog(), busy: 3 * activity,
		policy: spi.Policy{Lease: lease, ActivityTimeout: activity}}
	srv := e.idleServer(b)
	ids := e.submitKeys(srv, b.kind.ID, "hang", "busy")
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(e.ctx, lease/2)
		task, err := srv.Await(ctx, id)
		cancel()
		require.NoError(t, err, "the task must end long before its lease could expire")
		require.Equal(t, api.StatusSuccess, task.Status, "%s", id)
		require.Equal(t, 1, task.Attempt, "a run given up for inactivity is not an attempt")
	}
	b.log.read(func(l *runLog) {
		require.Equal(t, 2, l.starts[string(ids[0])], "the hung run's task ran again")
		require.Equal(t, 1, l.starts[string(ids[1])], "a run that checkpoints keeps its task")
	})
	var hung error
	b.log.read(func(l *runLog) {
		for _, cause := range l.ends {
			if cause != nil {
				require.Nil(t, hung, "only one run ends with an error")
				hung = cause
			}
		}
	})
	require.ErrorIs(t, hung, spi.ErrInactive)
	require.ErrorIs(t, hung, api.ErrHalt)
}
