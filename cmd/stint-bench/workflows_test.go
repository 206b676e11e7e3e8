package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/provision"
)

// TestWorkflowScenario runs every shape of the workflow scenario at a tiny
// size (the diamonds: 10 workflows from 3 callers) on stint and pg-boss (installing it into the cache folder if it is
// not there yet) and checks that every node ran, that the chain's hops
// were measured, and that stint's ratios to pg-boss and to its plain
// tasks are there.
func TestWorkflowScenario(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	provision.Require(t, ctx, nodeJS)

	cfg := defaultConfig()
	cfg.systems = "stint,pgboss"
	cfg.wf = workflowConfig{on: true, shapes: "fanout,fanin,layered,chain,diamonds", n: 50, layers: 3, width: 4, chain: 4, diamonds: 10, callers: 3}
	cfg.timeout = 2 * time.Minute
	cfg.runs = 1
	rep, err := newTestBench(t, cfg).run(ctx)
	require.NoError(t, err)
	got := map[string]Result{}
	for _, r := range rep.Results {
		require.Empty(t, r.Error, "%s %s", r.Scenario, r.System)
		got[r.Scenario+"|"+r.Metric+"|"+r.System] = r
	}
	for _, c := range []struct {
		scenario, metric, system string
		tasks                    int64
	}{
		{"workflow fan-out 1->50", "work", sysStint, 51}, {"workflow fan-out 1->50", "submit", sysStint, 51},
		{"workflow fan-out 1->50", "work", sysPlain, 50}, {"workflow fan-out 1->50", "work", sysPgBoss, 51},
		{"workflow fan-out 1->50", "submit", sysPgBoss, 51},
		{"workflow fan-in 50->1", "work", sysStint, 51}, {"workflow fan-in 50->1", "work", sysPgBoss, 51},
		{"workflow layered 3x4", "work", sysStint, 12}, {"workflow layered 3x4", "work", sysPgBoss, 12},
		{"workflow chain 4", "work", sysStint, 4}, {"workflow chain 4", "work", sysPgBoss, 4},
		{"workflow chain 4", "finish->next start", sysStint, 3}, {"workflow chain 4", "finish->next start", sysPgBoss, 3},
		{"workflows 10 diamonds of 4, 3 callers", "work", sysStint, 40}, {"workflows 10 diamonds of 4, 3 callers", "work", sysPgBoss, 40},
		{"workflows 10 diamonds of 4, 3 callers", "work, workflows", sysStint, 10},
		{"workflows 10 diamonds of 4, 3 callers", "work, workflows", sysPgBoss, 10},
		{"workflows 10 diamonds of 4, 3 callers", "submit, workflows", sysStint, 10},
		{"workflows 10 diamonds of 4, 3 callers", "submit, workflows", sysPgBoss, 10},
	} {
		r, ok := got[c.scenario+"|"+c.metric+"|"+c.system]
		require.True(t, ok, "no row %s %s %s", c.scenario, c.metric, c.system)
		require.Equal(t, c.tasks, r.Tasks, "%s %s %s", c.scenario, c.metric, c.system)
		if c.system != sysStint {
			require.Positive(t, r.StintRatio, "%s %s %s: stint's ratio", c.scenario, c.metric, c.system)
		}
		if strings.Contains(c.metric, "->") {
			require.NotNil(t, r.Latency, "%s %s", c.scenario, c.system)
			require.Positive(t, r.Latency.P50MS, "%s %s", c.scenario, c.system)
		}
	}
	var table bytes.Buffer
	rep.writeTable(&table)
	t.Log("\n" + table.String())
	require.Contains(t, table.String(), "pg-boss "+pgbossVersion, "the table says which pg-boss ran")
}

// TestWorkflowShapes checks the graphs of each shape: their sizes and
// edges (of the diamonds, one workflow's).
func TestWorkflowShapes(t *testing.T) {
	t.Parallel()
	w := workflowConfig{n: 5, layers: 3, width: 4, chain: 6, diamonds: 1}
	for _, c := range []struct {
		shape        string
		nodes, edges int
	}{
		{shapeFanOut, 6, 5}, {shapeFanIn, 6, 5}, {shapeLayered, 12, 16}, {shapeChain, 6, 5}, {shapeDiamonds, 4, 4},
	} {
		names, deps := w.nodes(c.shape, w.chain)
		require.Len(t, names, c.nodes, c.shape)
		edges := 0
		seen := map[string]bool{}
		for i, d := range deps {
			for _, x := range d {
				require.True(t, seen[x], "%s: %s depends on %s, not before it", c.shape, names[i], x)
			}
			seen[names[i]] = true
			edges += len(d)
		}
		require.Equal(t, c.edges, edges, c.shape)
		cmd, total := w.pgbossArgs(c.shape)
		require.Equal(t, c.nodes, total, c.shape)
		require.True(t, strings.HasPrefix(cmd, "flow "+c.shape), cmd)
	}
	names, deps := w.nodes(shapeDiamonds, w.chain)
	require.Equal(t, []string{"a", "b", "c", "d"}, names)
	require.Equal(t, []string{"b", "c"}, deps[3], "the diamond's last node joins its two sides")
	names, deps = w.nodes(shapeLayered, w.chain)
	require.Equal(t, "l001-003", names[7])
	require.Equal(t, []string{"l000-003", "l000-000"}, deps[7], "the last of a layer depends on the first of the layer before")
}

// TestWorkflowFlags checks that the workflow scenario runs only when
// picked, alone, and that bad flags are refused.
func TestWorkflowFlags(t *testing.T) {
	t.Parallel()
	c, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	require.False(t, c.wf.on, "the workflow scenario runs only when picked")
	c, err = parseFlags([]string{"--workflows", "--systems", "stint,pgboss", "--workflows-n", "20"}, io.Discard)
	require.NoError(t, err)
	require.True(t, c.wf.on)
	require.False(t, c.burndown || c.latency || c.scale || c.flow.picked(), "--workflows alone picks only the workflows")
	require.Equal(t, 20, c.wf.n)
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--workflows", "--workflows-n", "1"}, "--workflows-n must be more than 1"},
		{[]string{"--workflows", "--workflows-shapes", "fanout,star"}, `unknown shape "star"`},
		{[]string{"--workflows", "--workflows-peer-chain", "-3"}, "--workflows-peer-chain must be 0 or more than 1"},
		{[]string{"--workflows", "--workflows-shapes", "diamonds", "--workflows-callers", "0"}, "--workflows-callers must be at least 1"},
		{[]string{"--workflows", "--systems", "pgboss"}, "--systems must include stint"},
		{[]string{"--systems", "stint,bullmq"}, `unknown system "bullmq"`},
	} {
		var stderr bytes.Buffer
		_, err := parseFlags(bad.args, &stderr)
		require.Error(t, err, "%q", bad.args)
		require.Contains(t, err.Error()+stderr.String(), bad.want, fmt.Sprintf("%q", bad.args))
	}
}
