package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
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
