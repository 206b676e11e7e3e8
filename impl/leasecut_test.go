package impl_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// stalledRenewals is a store whose lease renewals, while stalled is set,
// get no answer until their context ends: a database too slow or too far
// to renew a lease in time. Meanwhile its takeovers find nothing to take
// over: one that took the cut run's lease before the run was given back
// would make its task due as a lost one, its attempt counted (it did, in
// 1 of many runs under load), which is not what this test is about.
type stalledRenewals struct {
	*postgres.Store
	stalled atomic.Bool
}

func (s *stalledRenewals) Takeover(ctx context.Context, limit int) (int, int, error) {
	if s.stalled.Load() {
		return 0, 0, nil
	}
	return s.Store.Takeover(ctx, limit)
}

func (s *stalledRenewals) Renew(ctx context.Context, rs []store.Renewal) (map[api.TaskID]bool, error) {
	if s.stalled.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.Store.Renew(ctx, rs)
}

// runStart is a run's attempt as it began, and end how it ended.
type runStart struct{ attempt int }

// cutRuns is a behavior whose runs block until their context ends and
// then fail with its cause, as a behavior whose statements the cut
// cancelled does.
type cutRuns struct {
	starts chan runStart
	ends   chan error
}

var cutKind = api.Kind[KeyParams, struct{}]{ID: "test.cut"}

func (b *cutRuns) Kind() api.Kind[KeyParams, struct{}]        { return cutKind }
func (b *cutRuns) TaskID(ids spi.IDs, p KeyParams) api.TaskID { return ids.Deterministic(p.Key) }
func (b *cutRuns) Policy() spi.Policy {
	return spi.Policy{Lease: time.Second, MaxAttempts: 2, BackoffMin: time.Minute, BackoffMax: time.Minute}
}

func (b *cutRuns) Run(ctx context.Context, rc spi.RunContext, _ KeyParams) (struct{}, error) {
	b.starts <- runStart{attempt: rc.Attempt()}
	<-ctx.Done()
	b.ends <- context.Cause(ctx)
	return struct{}{}, api.Retryable("cut", "the run's statement was cancelled: %v", context.Cause(ctx))
}

// TestARunCutOffForItsLeaseCountsNoAttempt checks that a run its node cut
// off because its lease could not be renewed in time (a slow or
// unreachable database), and that then failed, records no failure: its
// task runs again at once, on the same attempt, rather than after its
// backoff (a minute here) as a failed attempt, which would also spend
// one of its MaxAttempts on the database's slowness.
func TestARunCutOffForItsLeaseCountsNoAttempt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	st := &stalledRenewals{Store: e.st}
	b := &cutRuns{starts: make(chan runStart, 10), ends: make(chan error, 10)}
	reg := spi.NewRegistry()
	spi.MustRegister[KeyParams, struct{}](reg, b)
	// Its logs go nowhere: the Stop below gives up on the blocked run,
	// and the server's incident log may come after the test ended.
	srv, err := impl.NewServer(st, impl.ServerConfig{Node: "node", Registry: reg, PollInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, srv.Start(e.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = srv.Stop(ctx) // a blocked run ends only when cancelled: do not wait for it
	})

	st.stalled.Store(true)
	sub, err := srv.Submit(e.ctx, api.SubmitRequest{Behavior: cutKind.ID, Params: []byte(`{"key":"a"}`)})
	require.NoError(t, err)
	wait := func(what string) {
		t.Helper()
		select {
		case <-e.ctx.Done():
			require.FailNow(t, "timed out waiting for "+what)
		case s := <-b.starts:
			require.Equal(t, 1, s.attempt, "%s: the cut run was counted as an attempt", what)
		}
	}
	wait("the first run")
	select {
	case <-e.ctx.Done():
		require.FailNow(t, "the run was not cut off when its lease ran out")
	case cause := <-b.ends:
		require.ErrorIs(t, cause, api.ErrHalt)
	}
	// The database answers takeovers again only once the cut run was
	// given back (or its next run began).
	waitFor(t, time.Minute, "the cut run given back", func() bool {
		if len(b.starts) > 0 {
			return true
		}
		task, err := srv.Get(e.ctx, sub.ID)
		return err == nil && task.Status != api.StatusRunning
	})
	st.stalled.Store(false)
	wait("the run after the cut")
	task, err := srv.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Zero(t, task.Errors, "the cut run recorded a failure")
	require.Nil(t, task.Error, "the cut run recorded a failure")
}
