package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
)

// TestWorkflowsCommands submits a workflow from a file and waits for it,
// shows it in each format, refuses bad workflows with exit code 2 storing
// nothing, and cancels one.
func TestWorkflowsCommands(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	startServer(t, ctx, dsn, "wf-node")
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
		return path
	}
	good := write("good.json", `{"id": "wf-cli", "nodes": [
		{"name": "fetch", "task": {"behavior": "demo.echo", "params": {"text": "a"}}},
		{"name": "merge", "task": {"behavior": "demo.echo", "params": {"text": "b"}}, "depends_on": ["fetch"]},
		{"name": "notify", "task": {"behavior": "demo.echo", "params": {"text": "c"}}, "finally": true}]}`)
	r := runCLI(ctx, "workflows", "submit", good, "--wait", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "workflow wf-cli: succeeded (3 success)")
	require.Regexp(t, `merge\s+success\s+all_succeeded\s+fetch`, r.stdout)

	r = runCLI(ctx, "workflows", "show", "wf-cli", "--format", "json", "--db", dsn)
	requireOK(t, r)
	var w api.Workflow
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &w))
	require.Equal(t, api.WorkflowSucceeded, w.State)
	require.Len(t, w.Nodes, 3)
	r = runCLI(ctx, "workflows", "show", "wf-cli", "--format", "mermaid", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "graph TD")
	require.Contains(t, r.stdout, `["merge: success"]`)
	r = runCLI(ctx, "workflows", "show", "wf-cli", "--format", "dot", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, `digraph "wf-cli"`)

	for name, tc := range map[string]struct {
		body, want string
	}{
		"cycle":       {`{"nodes": [{"name": "a", "task": {"behavior": "demo.echo", "params": {"text": "x"}}, "depends_on": ["b"]}, {"name": "b", "task": {"behavior": "demo.echo", "params": {"text": "x"}}, "depends_on": ["a"]}]}`, "cycle"},
		"unknown dep": {`{"nodes": [{"name": "a", "task": {"behavior": "demo.echo", "params": {"text": "x"}}, "depends_on": ["zz"]}]}`, `"zz"`},
		"bad json":    {`{"nodes": [`, "not a workflow"},
		"bad field":   {`{"nodes": [], "nope": 1}`, "nope"},
		"bad delay":   {`{"nodes": [{"name": "a", "task": {"behavior": "demo.echo", "delay": "soon"}}]}`, "nodes[0].task.delay"},
		"bad params":  {`{"nodes": [{"name": "a", "task": {"behavior": "demo.echo", "params": {"text": 1}}}]}`, "nodes[0].task.params.text"},
	} {
		r := runCLI(ctx, "workflows", "submit", write(name+".json", tc.body), "--db", dsn)
		require.Equal(t, exitUsage, r.code, "%s: %s", name, r.stderr)
		require.Contains(t, r.stderr, tc.want, name)
	}
	r = runCLI(ctx, "workflows", "show", "wf-cli", "--format", "svg", "--db", dsn)
	require.Equal(t, exitUsage, r.code)
	r = runCLI(ctx, "workflows", "show", "no-such-wf", "--db", dsn)
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "not found")

	later := write("later.json", `{"id": "wf-later", "nodes": [
		{"name": "a", "task": {"behavior": "demo.echo", "params": {"text": "x"}, "delay": "1h"}},
		{"name": "b", "task": {"behavior": "demo.echo", "params": {"text": "x"}}, "depends_on": ["a"]}]}`)
	requireOK(t, runCLI(ctx, "workflows", "submit", later, "--db", dsn))
	r = runCLI(ctx, "workflows", "show", "wf-later", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `b\s+waiting \(dependencies\)\s+all_succeeded\s+a\s+waits for a`, r.stdout)
	requireOK(t, runCLI(ctx, "workflows", "cancel", "wf-later", "--db", dsn))
	r = runCLI(ctx, "workflows", "show", "wf-later", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "workflow wf-later: cancelled")
	requireOK(t, runCLI(ctx, "workflows", "retry", "wf-later", "--db", dsn))
	r = runCLI(ctx, "workflows", "retry", "wf-cli", "--db", dsn)
	require.Equal(t, exitFailure, r.code, "a succeeded workflow has nothing to retry: %s", r.stderr)
	require.Contains(t, r.stderr, "no failed node")

	held := write("held.json", `{"id": "wf-held", "nodes": [
		{"name": "a", "task": {"behavior": "demo.echo", "params": {"text": "x"}, "delay": "1h"}}]}`)
	requireOK(t, runCLI(ctx, "workflows", "submit", held, "--db", dsn))
	for _, verb := range []string{"hold", "release", "rm"} {
		requireOK(t, runCLI(ctx, "workflows", verb, "wf-held", "--db", dsn))
	}
	r = runCLI(ctx, "workflows", "show", "wf-held", "--db", dsn)
	require.Equal(t, exitFailure, r.code, "a removed workflow is gone: %s", r.stdout)
	r = runCLI(ctx, "workflows", "hold", "wf-cli", "--db", dsn)
	require.Equal(t, exitFailure, r.code, "an ended workflow cannot be held")
	require.Contains(t, r.stderr, "ended")
	r = runCLI(ctx, "workflows", "rm", "bad id", "--db", dsn)
	require.Equal(t, exitUsage, r.code, "%s", r.stderr)
}

// TestWorkflowsShowWide shows a fan-in of 2,000 nodes: the text table
// cuts the join's lists of names to their count and lists the nodes in
// the graph's order, and the mermaid and dot graphs group the wide layer
// by state, draw the finally node's dependence from the join alone and
// colour each box by its state.
func TestWorkflowsShowWide(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t) // no server: the nodes wait
	nodes := make([]map[string]any, 0, 2002)
	var jobs []string
	for i := range 2000 {
		name := fmt.Sprintf("job-%04d", i)
		jobs = append(jobs, name)
		nodes = append(nodes, map[string]any{"name": name, "task": map[string]any{"behavior": "demo.echo", "params": map[string]string{"text": name}}})
	}
	nodes = append(nodes,
		map[string]any{"name": "a-merge", "task": map[string]any{"behavior": "demo.echo", "params": map[string]string{"text": "m"}}, "depends_on": jobs},
		map[string]any{"name": "notify", "task": map[string]any{"behavior": "demo.echo", "params": map[string]string{"text": "n"}}, "finally": true})
	raw, err := json.Marshal(map[string]any{"id": "wf-wide", "nodes": nodes})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "wide.json")
	require.NoError(t, os.WriteFile(path, raw, 0o600))
	requireOK(t, runCLI(ctx, "workflows", "submit", path, "--db", dsn))
	requireOK(t, runCLI(ctx, "tasks", "hold", "wf-wide/job-0007", "--db", dsn))

	r := runCLI(ctx, "workflows", "show", "wf-wide", "--db", dsn)
	requireOK(t, r)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.Len(t, lines, 2+2002)
	for _, line := range lines {
		require.Less(t, len(line), 200, "a line of the table: %.300s", line)
	}
	require.Regexp(t, `^job-0000\s+scheduled\s`, lines[2], "the nodes without dependencies come first, by name")
	require.Regexp(t, `^job-0007\s+held\s`, lines[9])
	require.Regexp(t, `^a-merge\s+waiting \(dependencies\)\s+all_succeeded\s+2,000 nodes: job-0000 … job-1999\s+waits for 2,000 nodes: job-0000 … job-1999$`,
		lines[2002], "the join comes after its dependencies")
	require.Regexp(t, `^notify\s+waiting \(dependencies\)\s+all_ended\s+all other nodes \(finally\)\s+waits for 2,001 nodes: a-merge … job-1999$`, lines[2003])

	r = runCLI(ctx, "workflows", "show", "wf-wide", "--format", "mermaid", "--db", dsn)
	requireOK(t, r)
	require.Less(t, len(r.stdout), 2000, r.stdout)
	require.Equal(t, 3, strings.Count(r.stdout, "-->"), "the scheduled and the held jobs to the join, the join to notify:\n%s", r.stdout)
	merge, notify := fmt.Sprintf("n%x", "a-merge"), fmt.Sprintf("n%x", "notify")
	require.Contains(t, r.stdout, `g0_0["1,999 nodes: job-0000 … job-1999: scheduled"]`)
	require.Contains(t, r.stdout, `g0_1["job-0007: held"]`)
	require.Contains(t, r.stdout, `g0_0 -->|"1,999"| `+merge)
	require.Contains(t, r.stdout, "g0_1 --> "+merge)
	require.Contains(t, r.stdout, merge+" --> "+notify)
	require.Contains(t, r.stdout, "classDef scheduled fill:#eceefc,stroke:#4f5bd5\n  class g0_0 scheduled\n")
	require.Contains(t, r.stdout, "classDef held fill:#fdf2dd,stroke:#a15c00,stroke-dasharray:5 3\n  class g0_1 held\n")
	require.Contains(t, r.stdout, "class "+merge+","+notify+" waiting\n")

	r = runCLI(ctx, "workflows", "show", "wf-wide", "--format", "dot", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, 3, strings.Count(r.stdout, "->"), r.stdout)
	require.Contains(t, r.stdout, `g0_0 [label="1,999 nodes: job-0000 … job-1999: scheduled", fillcolor="#eceefc", color="#4f5bd5"];`)
	require.Contains(t, r.stdout, `g0_0 -> `+merge+` [label="1,999"];`)
	require.Contains(t, r.stdout, merge+" -> "+notify+";")
	if dot, err := exec.LookPath("dot"); err == nil {
		cmd := exec.CommandContext(ctx, dot, "-Tsvg")
		cmd.Stdin = strings.NewReader(r.stdout)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "Graphviz reads the graph: %s", out)
	}

	r = runCLI(ctx, "workflows", "show", "wf-wide", "--format", "json", "--db", dsn)
	requireOK(t, r)
	var w api.Workflow
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &w))
	n, ok := w.Node("a-merge")
	require.True(t, ok)
	require.Len(t, n.DependsOn, 2000, "json has every name")
}
