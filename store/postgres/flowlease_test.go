package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// claimAfterWait runs a claim of req under flow control while another
// transaction holds the turn of its behavior, as another claimer does
// while it claims, and gives the turn up once the claim has waited for it
// for at least wait, by the database's clock from when its wait began
// (pg_locks.waitstart). The wait looked at is one in this test's
// database, the cluster being shared by parallel tests that wait for
// turns too; and it is the claim's own, not the time since this function
// started it, since the claim's goroutine, connection and transaction may
// start long after that on a busy machine. It returns what the claim
// returned and the database's time just before the turn was given up.
func claimAfterWait(t *testing.T, ctx context.Context, st *postgres.Store, req store.ClaimRequest, wait time.Duration) ([]store.Claimed, store.FlowHeld, time.Time) {
	t.Helper()
	holder, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('stint.cap:' || $1::text, 0))`, string(req.Behaviors[0].Behavior))
	require.NoError(t, err)
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
		var waited bool
		err := st.Pool().QueryRow(ctx, `SELECT coalesce(clock_timestamp() - min(waitstart) > $1, false)
			FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, wait).Scan(&waited)
		return err == nil && waited
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
			claimed, held, released := claimAfterWait(t, ctx, st, store.ClaimRequest{Node: "n1", Limit: 10, PerGroup: perGroup, Cluster: 10, Flow: true,
				Behaviors: []store.BehaviorLease{{Behavior: behavior, Lease: lease}}}, lease+lease/2)
			require.Len(t, claimed, 3)
			// The node counts the leases from after the wait too.
			require.Greater(t, held.LeaseDelay, lease, "the claim waited for its turn for longer than its lease")
			// The lease a takeover reads expires a whole lease after the
			// turn was given up, by the database's clock; one counted from
			// before the wait would have been over by then. A takeover
			// right after the claim said so only while the claim's commit
			// and the takeover's round trip took less than the lease: on a
			// loaded machine they took more than its second, and it took
			// the tasks over.
			var leases, short int
			require.NoError(t, st.Pool().QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE expires_at < $1::timestamptz + $2 * interval '1 microsecond')
				FROM stint_lease`, released, lease.Microseconds()).Scan(&leases, &short))
			require.Equal(t, 1, leases, "the claim's lease")
			require.Zero(t, short, "a lease counted from before the wait would be over when the turn was given up")
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
			// A unit frees every period/2: long enough that the second
			// claim below comes before it on a busy machine.
			const behavior, period = "sem.rated", 4 * time.Second
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

// A claim under flow control spends each task's own rate uses, whatever
// the tasks before and after it in the claim use: the claim sends a row's
// uses only when they differ from the row before's, and a task without
// uses, or with the same as the one before, must be read as such. Each
// key's state after the claim is its start time plus the units spent
// times the period over the limit (10 ms a unit).
func TestFlowClaimSpendsEachTasksOwnUses(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	require.NoError(t, st.SetRateLimit(ctx, api.RateLimit{Name: "sem.mixed", Limit: 100, Period: time.Second}))
	k1 := []store.RateUse{{Limit: "sem.mixed", Key: "k1", Units: 1}}
	uses := [][]store.RateUse{k1, k1, {{Limit: "sem.mixed", Key: "k2", Units: 2}}, nil, k1, nil, nil,
		{{Limit: "sem.mixed", Key: "k1", Units: 1}, {Limit: "sem.mixed", Key: "k3", Units: 5}}}
	const behavior = "sem.mixed"
	for i, u := range uses {
		submitT(t, ctx, st, store.NewTask{ID: api.TaskID(fmt.Sprintf("mixed-%d", i)), Behavior: behavior, RateUses: u})
	}
	claimed, _, err := st.ClaimFlow(ctx, store.ClaimRequest{Node: "n1", Limit: 10, Flow: true,
		Behaviors: []store.BehaviorLease{{Behavior: behavior, Lease: time.Minute}}})
	require.NoError(t, err)
	require.Len(t, claimed, len(uses))

	rows, err := st.Pool().Query(ctx, `SELECT k.key, (extract(epoch FROM k.tat - t.at) * 1000)::int
		FROM stint_rate_key k, (SELECT max(executed_at) AS at FROM stint_task) t WHERE k.name = 'sem.mixed'`)
	require.NoError(t, err)
	spentMS := map[string]int{}
	var key string
	var ms int
	_, err = pgx.ForEachRow(rows, []any{&key, &ms}, func() error { spentMS[key] = ms; return nil })
	require.NoError(t, err)
	require.Equal(t, map[string]int{"k1": 40, "k2": 20, "k3": 50}, spentMS)
}

// A claim under flow control for a behavior whose last claim found tasks
// (ClaimRequest.Busy) takes the turn without looking for a due hint: with
// nothing due it finds nothing, under its cluster cap, and with tasks due
// it claims them.
func TestBusyFlowClaimTakesTheTurnWithoutLooking(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	const behavior = "sem.busy"
	req := store.ClaimRequest{Node: "n1", Limit: 10, Cluster: 5, Busy: true,
		Behaviors: []store.BehaviorLease{{Behavior: behavior, Lease: time.Minute}}}
	claimed, _, err := st.ClaimFlow(ctx, req)
	require.NoError(t, err)
	require.Empty(t, claimed)
	for i := range 7 {
		submitT(t, ctx, st, store.NewTask{ID: api.TaskID(fmt.Sprintf("busy-%d", i)), Behavior: behavior})
	}
	claimed, _, err = st.ClaimFlow(ctx, req)
	require.NoError(t, err)
	require.Len(t, claimed, 5, "the cluster cap binds")
}
