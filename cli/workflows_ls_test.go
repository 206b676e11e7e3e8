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

// TestWorkflowsLs lists workflows as a table and as JSON, by state and a
// page at a time, and refuses bad flags with exit code 2.
func TestWorkflowsLs(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	r := runCLI(ctx, "workflows", "ls", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stderr, "no workflows match")
	for _, id := range []string{"wf-ls-a", "wf-ls-b"} {
		path := filepath.Join(t.TempDir(), id+".json")
		require.NoError(t, os.WriteFile(path, []byte(`{"id": "`+id+`", "nodes": [
			{"name": "a", "task": {"behavior": "demo.echo", "params": {"text": "x"}, "delay": "1h"}},
			{"name": "b", "task": {"behavior": "demo.echo", "params": {"text": "x"}}, "depends_on": ["a"]}]}`), 0o600))
		requireOK(t, runCLI(ctx, "workflows", "submit", path, "--db", dsn))
	}
	requireOK(t, runCLI(ctx, "workflows", "cancel", "wf-ls-b", "--db", dsn))

	r = runCLI(ctx, "workflows", "ls", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `ID\s+STATE\s+PENDING\s+CREATED\s+FINISHED`, r.stdout)
	require.Regexp(t, `wf-ls-a\s+running\s+2\s`, r.stdout)
	require.Regexp(t, `wf-ls-b\s+cancelled\s+0\s`, r.stdout)
	r = runCLI(ctx, "workflows", "ls", "--state", "cancelled", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "wf-ls-b")
	require.NotContains(t, r.stdout, "wf-ls-a")

	r = runCLI(ctx, "workflows", "ls", "--json", "--limit", "1", "--db", dsn)
	requireOK(t, r)
	var page api.WorkflowPage
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
	require.Len(t, page.Workflows, 1)
	require.Equal(t, api.TaskID("wf-ls-a"), page.Next)
	r = runCLI(ctx, "workflows", "ls", "--after", string(page.Next), "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "wf-ls-b")
	require.NotContains(t, r.stdout, "wf-ls-a")
	require.NotContains(t, r.stdout, "next:")

	for _, args := range [][]string{{"--state", "done"}, {"--limit", "0"}, {"--limit", "1001"}, {"--after", "x"}, {"extra"}} {
		r := runCLI(ctx, append([]string{"workflows", "ls", "--db", dsn}, args...)...)
		require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
	}
}
