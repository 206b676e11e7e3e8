package cleanup

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// TestOwnRetentionOverridesTheBehaviors submits tasks with a retention of
// their own, shorter and longer than their behavior's, and checks that the
// cleanup deletes a finished task when its own retention has passed, and
// only then, whatever its behavior.
func TestOwnRetentionOverridesTheBehaviors(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := e.registry(false, Config{})
	srv := e.server("node", reg)
	short := func(r api.SubmitRequest, d time.Duration) api.SubmitRequest { r.Retention = d; return r }
	reqs := []api.SubmitRequest{
		short(req("test.fast", "own-short-ok", false), time.Millisecond), // deleted: 1ms, not 7 days
		short(req("test.fast", "own-short-bad", true), time.Millisecond), // deleted: 1ms, not 30 days
		short(req("test.long", "own-long-bad", true), time.Hour),         // kept: 1h, not 1ms
		req("test.long", "behavior-bad", true),                           // deleted: the behavior's 1ms
		short(req("test.short", "own-long-ok", false), 30*24*time.Hour),  // kept: 30 days, not 1ms
	}
	subs, err := srv.SubmitMany(e.ctx, reqs)
	require.NoError(t, err)
	for _, s := range subs {
		_, err := srv.Await(e.ctx, s.ID)
		require.NoError(t, err)
	}
	task, err := srv.Get(e.ctx, subs[0].ID)
	require.NoError(t, err)
	require.Equal(t, time.Millisecond, task.Retention, "the row holds the task's retention")
	task, err = srv.Get(e.ctx, subs[3].ID)
	require.NoError(t, err)
	require.Zero(t, task.Retention, "none: the behavior's")

	// Not finished, so never deleted, however short its retention.
	later, err := srv.Submit(e.ctx, short(api.SubmitRequest{Behavior: "test.fast", Params: []byte(`{"key":"later"}`), Delay: time.Hour}, time.Millisecond))
	require.NoError(t, err)
	// A behavior this registry does not hold: its own retention is known.
	_, err = e.st.Submit(e.ctx, []store.NewTask{{ID: "gone-1", Behavior: "test.gone", Params: []byte(`{}`), Retention: time.Millisecond}})
	require.NoError(t, err)
	claimed, err := e.st.Claim(e.ctx, store.ClaimRequest{Node: "x", Limit: 1, Behaviors: []store.BehaviorLease{{Behavior: "test.gone", Lease: time.Minute}}})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	ok, err := e.st.Finish(e.ctx, []store.Completion{{LeaseRef: claimed[0].LeaseRef, Status: api.StatusSuccess, Result: []byte(`{}`)}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, ok)

	// Bad retentions are refused, and store nothing.
	for _, d := range []time.Duration{-time.Second, 101 * 365 * 24 * time.Hour} {
		_, err := srv.Submit(e.ctx, short(req("test.fast", "bad-retention", false), d))
		require.ErrorIs(t, err, api.ErrInvalid, d)
	}
	_, err = srv.Get(e.ctx, spi.NewIDs("test.fast").Deterministic("bad-retention"))
	require.ErrorIs(t, err, api.ErrNotFound)

	c := New(e.st, reg, Config{BatchSize: 2})
	res, err := c.Run(e.ctx, nil, Params{})
	require.NoError(t, err)
	require.Equal(t, map[string]int{"test.fast/success": 1, "test.fast/failure": 1, "test.long/failure": 1, "test.gone/success": 1}, res.Deleted)
	for i, s := range subs {
		_, err := srv.Get(e.ctx, s.ID)
		if i == 2 || i == 4 {
			require.NoError(t, err, "kept: %s", reqs[i].Params)
		} else {
			require.ErrorIs(t, err, api.ErrNotFound, "deleted: %s", reqs[i].Params)
		}
	}
	_, err = srv.Get(e.ctx, later.ID)
	require.NoError(t, err)
	_, err = srv.Get(e.ctx, "gone-1")
	require.ErrorIs(t, err, api.ErrNotFound)
}
