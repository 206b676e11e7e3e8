package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// holdTurn takes the turn of behavior in a transaction of its own, as
// another claimer does while it claims. The function it returns waits
// until a claim has waited for the turn and at least d has passed, then
// gives the turn up and returns the database's time just before.
func holdTurn(t *testing.T, ctx context.Context, st *postgres.Store, behavior string) func(d time.Duration) time.Time {
	t.Helper()
	holder, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('stint.cap:' || $1::text, 0))`, behavior)
	require.NoError(t, err)
	begun := time.Now()
	return func(d time.Duration) time.Time {
		t.Helper()
		require.Eventually(t, func() bool {
			var waiting bool
			err := st.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)`).Scan(&waiting)
			return err == nil && waiting && time.Since(begun) > d
		}, time.Minute, 10*time.Millisecond)
		var at time.Time
		require.NoError(t, holder.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at))
		require.NoError(t, holder.Commit(ctx))
		return at
	}
}

// A claim under flow control that waited for its behavior's turn longer
// than its lease still gets a whole lease: its tasks are not taken over as
// they start, and it says how long it waited (FlowHeld.LeaseDelay), for
// the node to count the leases from after the wait too. Both ways of claiming wait: the claim tried at once (no caps
// per key) and the careful one.
func TestFlowClaimLeaseRunsFromTheClaimNotItsWait(t *testing.T) {
	t.Parallel()
	for _, perGroup := range []int{0, 5} {
		t.Run(fmt.Sprintf("per group %d", perGroup), func(t *testing.T) {
			t.Parallel()
			ctx, st := openT(t)
			const behavior = "sem.flow"
			for i := range 3 {
				submitT(t, ctx, st, store.NewTask{ID: api.TaskID(fmt.Sprintf("flow-%d", i)), Behavior: behavior})
			}
			release := holdTurn(t, ctx, st, behavior)
			const lease = time.Second
			type result struct {
				claimed []store.Claimed
				held    store.FlowHeld
				err     error
			}
			done := make(chan result, 1)
			go func() {
				claimed, held, err := st.ClaimFlow(ctx, store.ClaimRequest{Node: "n1", Limit: 10, PerGroup: perGroup, Cluster: 10, Flow: true,
					Behaviors: []store.BehaviorLease{{Behavior: behavior, Lease: lease}}})
				done <- result{claimed, held, err}
			}()
			release(lease + lease/2)

			r := <-done
			require.NoError(t, r.err)
			require.Len(t, r.claimed, 3)
			// The node counts the leases from after the wait too.
			require.Greater(t, r.held.LeaseDelay, lease, "the claim waited for its turn for longer than its lease")
			_, lost, err := st.Takeover(ctx, 100)
			require.NoError(t, err)
			require.Zero(t, lost, "a lease counted from before the wait would be over")
		})
	}
}

// A claim under flow control that waited for its behavior's turn spends
// rate budget at the time it claims, not at the start of its wait: the
// next claim right after it finds the budget spent, where budget spent
// before the wait would have refilled and let it start a second burst at
// once. The claim's tasks start at that time too.
func TestFlowClaimSpendsRateAfterItsWait(t *testing.T) {
	t.Parallel()
	for _, perGroup := range []int{0, 5} {
		t.Run(fmt.Sprintf("per group %d", perGroup), func(t *testing.T) {
			t.Parallel()
			ctx, st := openT(t)
			const behavior, period = "sem.rated", time.Second
			require.NoError(t, st.SetRateLimit(ctx, api.RateLimit{Name: "sem.rate", Limit: 2, Period: period}))
			// A burst's worth: the claim tried at once takes them, where
			// more would send it to the careful claim, which begins after
			// the wait.
			submitRated := func(from int) {
				for i := from; i < from+2; i++ {
					submitT(t, ctx, st, store.NewTask{ID: api.TaskID(fmt.Sprintf("rated-%d", i)), Behavior: behavior,
						RateUses: []store.RateUse{{Limit: "sem.rate", Units: 1}}})
				}
			}
			submitRated(0)
			req := store.ClaimRequest{Node: "n1", Limit: 10, PerGroup: perGroup, Flow: true,
				Behaviors: []store.BehaviorLease{{Behavior: behavior, Lease: time.Minute}}}
			release := holdTurn(t, ctx, st, behavior)
			done := make(chan []store.Claimed, 1)
			go func() {
				claimed, _, err := st.ClaimFlow(ctx, req)
				assert.NoError(t, err)
				done <- claimed
			}()
			// The claim waits for the turn for longer than the limit's period.
			released := release(period + period/2)

			first := <-done
			require.Len(t, first, 2, "the burst")
			var started time.Time
			require.NoError(t, st.Pool().QueryRow(ctx, `SELECT min(executed_at) FROM stint_task WHERE id = $1`, string(first[0].ID)).Scan(&started))
			require.False(t, started.Before(released), "the tasks start when claimed (%s), not when the claim began to wait (turn released %s)", started, released)
			submitRated(2)
			second, _, err := st.ClaimFlow(ctx, req)
			require.NoError(t, err)
			require.Empty(t, second, "the budget of the first claim is spent as of its claim")
		})
	}
}
