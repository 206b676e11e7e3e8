package impl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
)

// echoNode is a workflow node of demo.echo, a run that touches no table.
func echoNode(name string, deps ...string) api.WorkflowNode {
	return api.WorkflowNode{Name: name, Task: api.SubmitRequest{Behavior: demo.Echo.ID, Params: mustJSON(demo.EchoParams{Text: name})}, DependsOn: deps}
}

// TestTheLargestWorkflowRunsThrough submits a workflow of
// api.MaxWorkflowNodes nodes, a root, a fan-out of all but two from it and
// a join of the fan-out, and runs it to success. The root's growth by one
// more node is refused as over the limit and adds nothing.
func TestTheLargestWorkflowRunsThrough(t *testing.T) {
	if raceDetector {
		t.Skip("a test of size, not of goroutines: it runs without the race detector")
	}
	t.Parallel()
	e := setup(t)
	srv := e.growServer()
	// Longer than setup's context: on a busy machine the run takes
	// minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	width := api.MaxWorkflowNodes - 2
	nodes := make([]api.WorkflowNode, 0, api.MaxWorkflowNodes)
	nodes = append(nodes, growNode("root", api.WorkflowGrowth{Nodes: []api.WorkflowNode{echoNode("extra", "root")}}))
	leaves := make([]string, width)
	for i := range leaves {
		leaves[i] = fmt.Sprintf("leaf-%d", i)
		nodes = append(nodes, echoNode(leaves[i], "root"))
	}
	nodes = append(nodes, echoNode("join", leaves...))

	sub, err := srv.SubmitWorkflow(ctx, api.WorkflowRequest{ID: "wf-largest", Nodes: nodes})
	require.NoError(t, err)
	require.True(t, sub.Created)
	w, err := srv.AwaitWorkflow(ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowSucceeded, w.State)
	require.Equal(t, map[api.Status]int{api.StatusSuccess: api.MaxWorkflowNodes}, w.Counts)
	require.Len(t, w.Nodes, api.MaxWorkflowNodes)

	root, _ := w.Node("root")
	var grown GrowResult
	require.NoError(t, json.Unmarshal(root.Task.Result, &grown))
	require.True(t, grown.Invalid, "growth past the limit: %+v", grown)
	require.Contains(t, grown.Err, "over the limit of 100000")
	_, added := w.Node("extra")
	require.False(t, added, "a refused growth adds nothing")
	var stored int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM stint_task WHERE id = 'wf-largest/extra'`).Scan(&stored))
	require.Zero(t, stored)

	join, _ := w.Node("join")
	require.Len(t, join.DependsOn, width)
	require.Equal(t, api.StatusSuccess, join.Task.Status)
}
