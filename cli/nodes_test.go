package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// TestNodesLsShowsDatabaseIncidents: `stint nodes ls` says how the
// database served each node, as the node reported it with its last
// heartbeat: the incidents going on, else "ok" and the last that ended.
func TestNodesLsShowsDatabaseIncidents(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	st, err := postgres.Open(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	began := time.Now().Add(-time.Minute)
	for _, n := range []struct {
		id     string
		health store.NodeHealth
	}{
		{"node-degraded", store.NodeHealth{Incidents: []store.NodeIncident{
			{Cause: "listener", Started: began, Failures: 3, Err: "listen: connection reset"}}}},
		{"node-recovered", store.NodeHealth{Last: &store.NodeIncident{
			Cause: "read_only", Started: began.Add(-time.Hour), Ended: began.Add(-time.Hour + 90*time.Second), Failures: 9}}},
		{"node-fine", store.NodeHealth{}},
	} {
		require.NoError(t, st.RegisterNode(ctx, store.Node{ID: n.id, Host: "h", PID: 1, Behaviors: []api.BehaviorID{"demo.echo", "cleanup"},
			BehaviorVersions: map[api.BehaviorID]int{"demo.echo": 3}}))
		require.NoError(t, st.HeartbeatNode(ctx, n.id, n.health))
	}

	r := runCLI(ctx, "nodes", "ls", "--db", dsn)
	requireOK(t, r)
	rows := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n")[1:] {
		rows[strings.Fields(line)[0]] = line
	}
	// Ages run from the database's clock at the listing: a slow run adds
	// seconds to them.
	require.Regexp(t, `\s+listener for 1m\d+s \(3 failures\)$`, rows["node-degraded"])
	require.Regexp(t, `\s+ok · last: read_only for 1m30s, 59m\d+s ago$`, rows["node-recovered"])
	require.Regexp(t, `\s+ok$`, rows["node-fine"])
	require.Contains(t, rows["node-fine"], " demo.echo@3,cleanup ", "a behavior's version follows its name")

	r = runCLI(ctx, "nodes", "ls", "--json", "--db", dsn)
	requireOK(t, r)
	var page struct{ Nodes []nodeJSON }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
	byID := map[string]nodeJSON{}
	for _, n := range page.Nodes {
		byID[n.ID] = n
	}
	require.Len(t, byID["node-degraded"].Incidents, 1)
	require.Equal(t, "listen: connection reset", byID["node-degraded"].Incidents[0].Err)
	require.Equal(t, "read_only", byID["node-recovered"].LastIncident.Cause)
	require.Empty(t, byID["node-fine"].Incidents)
	require.Nil(t, byID["node-fine"].LastIncident)
}
