package impl_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/store"
)

// TestMaintenanceDropsDeadNodesAndKeepsLiveOnes registers a node whose
// last heartbeat is an hour old: the servers' upkeep drops it, and keeps
// the live ones. The node timeout is a minute, far above any delay a busy
// machine puts on the live nodes' heartbeats, so only the ghost can go.
func TestMaintenanceDropsDeadNodesAndKeepsLiveOnes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	require.NoError(t, e.st.RegisterNode(e.ctx, store.Node{ID: "ghost", Host: "nowhere"}))
	_, err := e.pool.Exec(e.ctx, `UPDATE stint_node SET heartbeat_at = now() - interval '1 hour' WHERE id = 'ghost'`)
	require.NoError(t, err)
	fast := func(cfg *impl.ServerConfig) {
		cfg.NodeHeartbeat = 100 * time.Millisecond
		cfg.Maintenance = impl.Maintenance{Interval: 200 * time.Millisecond, NodeTimeout: time.Minute}
	}
	e.server("a", 5*time.Second, fast)
	e.server("b", 5*time.Second, fast)
	nodes := func() []string {
		list, err := e.st.Nodes(e.ctx)
		require.NoError(t, err)
		var ids []string
		for _, n := range list {
			ids = append(ids, n.ID)
		}
		return ids
	}
	waitFor(t, 30*time.Second, "the dead node to be dropped", func() bool { return !slices.Contains(nodes(), "ghost") })
	require.ElementsMatch(t, []string{"a", "b"}, nodes(), "live nodes stay")
}
