package impl_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// TestAFullBehaviorIsClaimedAgainWhenARunEnds runs a backlog of a behavior
// capped per node, per group key or across the cluster, on a server whose poll comes once a minute and which no
// submit notifies (the tasks are stored before it starts): once its runs
// fill the cap, only the end of one of them can lead to the next claim. A
// claim loop that waits for its poll runs one cap's worth and stops. The
// poll is ten minutes and the deadline 100 s, generous for 15 rounds of
// claims on a loaded machine (30 s was not, once).
func TestAFullBehaviorIsClaimedAgainWhenARunEnds(t *testing.T) {
	t.Parallel()
	cases := map[string]spi.Policy{
		"max concurrency":               {MaxConcurrency: 4},
		"max concurrency, flow control": {MaxConcurrency: 4, GroupConcurrency: 100},
		"group keys at their cap":       {GroupConcurrency: 2},
		"cluster cap":                   {ClusterConcurrency: 3},
	}
	for name, policy := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			kind := api.Kind[FlowParams, struct{}]{ID: "test.full"}
			policy.Lease, policy.MaxAttempts = 30*time.Second, 3
			const n = 60
			reqs := make([]api.SubmitRequest, n)
			for i := range reqs {
				reqs[i] = flowReq(kind, FlowParams{ID: fmt.Sprint(i), Customer: fmt.Sprint(i % 3), SleepMS: 10})
			}
			reg := func(c *impl.ServerConfig) {
				spi.MustRegister[FlowParams, struct{}](c.Registry, &flow{pool: e.pool, node: c.Node, kind: kind, policy: policy})
			}
			creg := spi.NewRegistry()
			spi.MustRegister[FlowParams, struct{}](creg, &flow{kind: kind, policy: policy})
			c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: creg})
			require.NoError(t, err)
			t.Cleanup(c.Close)
			_, err = c.SubmitMany(e.ctx, reqs)
			require.NoError(t, err)
			e.server("n1", 30*time.Second, reg, func(c *impl.ServerConfig) { c.PollInterval = 10 * time.Minute })
			waitFor(t, 100*time.Second, "every task to succeed", func() bool {
				return e.count(`SELECT count(*) FROM stint_task WHERE behavior = $1 AND status = 'success'`, string(kind.ID)) == n
			})
		})
	}
}
