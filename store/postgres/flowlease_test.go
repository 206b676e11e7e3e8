package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// claimAfterWait runs a claim of req under flow control while another
// transaction holds the turn of its behavior, as another claimer does
// while it claims, and gives the turn up once the claim has waited for it
// and at least wait has passed. It returns what the claim returned and
// the database's time just before the turn was given up.
func claimAfterWait(t *testing.T, ctx context.Context, st *postgres.Store, req store.ClaimRequest, wait time.Duration) ([]store.Claimed, store.FlowHeld, time.Time) {
	t.Helper()
	holder, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('stint.cap:' || $1::text, 0))`, string(req.Behaviors[0].Behavior))
	require.NoError(t, err)
	begun := time.Now()
	type result struct {
		claimed []store.Claimed
		held    store.FlowHeld
		err     error
	}
	done := make(chan result, 1)
	go func() {
		claimed, held, err := st.ClaimFlow(ctx, req)
		done <- result{claimed, held, err}
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		err := st.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)`).Scan(&waiting)
		return err == nil && waiting && time.Since(begun) > wait
	}, time.Minute, 10*time.Millisecond)
	var released time.Time
	require.NoError(t, holder.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&released))
	require.NoError(t, holder.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	return r.claimed, r.held, released
}

// A claim under flow control that waited for its behavior's turn longer
// than its lease still gets a whole lease: its tasks are not taken over as
// they start, and it says how long it waited (FlowHeld.LeaseDelay), for
// the node to count the leases from after the wait too. Both ways of
// claiming wait: the claim tried at once (no caps per key) and the
// careful one.
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
			const lease = time.Second
			claimed, held, _ := claimAfterWait(t, ctx, st, store.ClaimRequest{Node: "n1", Limit: 10, PerGroup: perGroup, Cluster: 10, Flow: true,
				Behaviors: []store.BehaviorLease{{Behavior: behavior, Lease: lease}}}, lease+lease/2)
			require.Len(t, claimed, 3)
			// The node counts the leases from after the wait too.
			require.Greater(t, held.LeaseDelay, lease, "the claim waited for its turn for longer than its lease")
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
			// The claim waits for the turn for longer than the limit's period.
			first, _, released := claimAfterWait(t, ctx, st, req, period+period/2)
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

// A lease row written by a node from before lease rows kept their task
// count (task_count NULL) still counts toward a cluster cap: the bound that
// lets a claim under the cap skip the exact count reads the row's array
// then. Counted as none, the claim below would start three tasks beside
// the four running, under a cap of five.
func TestClusterCapCountsLeaseRowsWithoutTheirCount(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	const behavior = "sem.capped"
	for i := range 10 {
		submitT(t, ctx, st, store.NewTask{ID: api.TaskID(fmt.Sprintf("capped-%d", i)), Behavior: behavior})
	}
	req := store.ClaimRequest{Node: "n1", Limit: 4, Cluster: 5, Behaviors: []store.BehaviorLease{{Behavior: behavior, Lease: time.Minute}}}
	claimed, err := st.Claim(ctx, req)
	require.NoError(t, err)
	require.Len(t, claimed, 4)
	tag, err := st.Pool().Exec(ctx, `UPDATE stint_lease SET task_count = NULL WHERE behavior = $1`, behavior)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())

	req.Limit = 3
	claimed, err = st.Claim(ctx, req)
	require.NoError(t, err)
	require.Len(t, claimed, 1, "four running under a cap of five leave one")
}
