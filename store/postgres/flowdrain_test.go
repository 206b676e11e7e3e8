package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// A claim under flow control says when it took every task its caps admit
// and left a cap full (FlowHeld.Drained): a claim right after it finds
// nothing. A claim that stopped at its own limit, or left no cap full, does
// not say so.
func TestAFlowClaimSaysWhenItTookAllItsCapsAdmit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                     string
		keys, perKey             int // the tasks: perKey of each of keys group keys
		perGroup, cluster, limit int
		claimed                  int
		drained                  bool
	}{
		{name: "every key at its cap", keys: 3, perKey: 5, perGroup: 2, limit: 100, claimed: 6, drained: true},
		{name: "the claim's limit before the caps", keys: 3, perKey: 5, perGroup: 2, limit: 4, claimed: 4},
		{name: "no key at its cap", keys: 3, perKey: 1, perGroup: 2, limit: 100, claimed: 3},
		{name: "the cluster cap filled", keys: 1, perKey: 10, cluster: 3, limit: 100, claimed: 3, drained: true},
		{name: "the cluster cap not reached", keys: 1, perKey: 10, cluster: 20, limit: 100, claimed: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, st := openT(t)
			const behavior = "sem.drain"
			var tasks []store.NewTask
			for i := range tc.keys * tc.perKey {
				tasks = append(tasks, store.NewTask{ID: api.TaskID(fmt.Sprintf("drain-%d", i)), Behavior: behavior,
					GroupKey: fmt.Sprintf("k%d", i%tc.keys)})
			}
			submitT(t, ctx, st, tasks...)
			req := store.ClaimRequest{Node: "n1", Limit: tc.limit, PerGroup: tc.perGroup, Cluster: tc.cluster, Flow: true,
				Behaviors: []store.BehaviorLease{{Behavior: behavior, Lease: time.Minute}}}
			claimed, held, err := st.ClaimFlow(ctx, req)
			require.NoError(t, err)
			require.Len(t, claimed, tc.claimed)
			require.Equal(t, tc.drained, held.Drained)
			if tc.drained {
				require.True(t, held.Capped, "a drained claim left a cap full")
				again, _, err := st.ClaimFlow(ctx, req)
				require.NoError(t, err)
				require.Empty(t, again, "a claim after a drained one")
			}
		})
	}
}
