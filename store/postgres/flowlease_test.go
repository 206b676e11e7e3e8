package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// A claim under flow control that waited for its behavior's turn longer
// than its lease still gets a whole lease: its tasks are not taken over as
// they start. Both ways of claiming wait: the claim tried at once (no caps
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
			// Another claimer holds the behavior's turn.
			holder, err := st.Pool().Begin(ctx)
			require.NoError(t, err)
			defer holder.Rollback(ctx) //nolint:errcheck // committed below
			_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('stint.cap:' || $1::text, 0))`, behavior)
			require.NoError(t, err)

			const lease = time.Second
			begun := time.Now()
			type result struct {
				claimed []store.Claimed
				err     error
			}
			done := make(chan result, 1)
			go func() {
				claimed, _, err := st.ClaimFlow(ctx, store.ClaimRequest{Node: "n1", Limit: 10, PerGroup: perGroup, Cluster: 10, Flow: true,
					Behaviors: []store.BehaviorLease{{Behavior: behavior, Lease: lease}}})
				done <- result{claimed, err}
			}()
			// The claim waits for the turn, for longer than its lease.
			require.Eventually(t, func() bool {
				var waiting bool
				err := st.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)`).Scan(&waiting)
				return err == nil && waiting && time.Since(begun) > lease+lease/2
			}, time.Minute, 10*time.Millisecond)
			require.NoError(t, holder.Commit(ctx))

			r := <-done
			require.NoError(t, r.err)
			require.Len(t, r.claimed, 3)
			_, lost, err := st.Takeover(ctx, 100)
			require.NoError(t, err)
			require.Zero(t, lost, "a lease counted from before the wait would be over")
		})
	}
}
