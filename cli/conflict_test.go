package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
)

// TestOperationsThatCannotApply: a workflow or task operation that the
// state of its workflow or task does not allow (api.ErrConflict, HTTP's
// 409) exits 1 with the store's reason, without the sentinel's words, and
// changes nothing: cancel of a finished workflow among them.
func TestOperationsThatCannotApply(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	startServer(t, ctx, dsn, "conflict-node")
	dir := t.TempDir()
	path := filepath.Join(dir, "done.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"id": "wf-done", "nodes": [
		{"name": "a", "task": {"behavior": "demo.echo", "params": {"text": "a"}}}]}`), 0o600))
	requireOK(t, runCLI(ctx, "workflows", "submit", path, "--wait", "--db", dsn))
	requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"x"}`, "--id", "task-later", "--delay", "1h", "--db", dsn))
	show := func() string {
		r := runCLI(ctx, "workflows", "show", "wf-done", "--format", "json", "--db", dsn)
		requireOK(t, r)
		r2 := runCLI(ctx, "tasks", "show", "task-later", "--json", "--db", dsn)
		requireOK(t, r2)
		var task api.Task
		require.NoError(t, json.Unmarshal([]byte(r2.stdout), &task))
		return r.stdout + string(task.Status) + task.UpdatedAt.String()
	}
	before := show()
	for _, tc := range []struct {
		args []string
		want string // the whole of stderr, a regular expression
	}{
		{[]string{"workflows", "cancel", "wf-done"}, `cancel workflow wf-done: .*ended`},
		{[]string{"workflows", "hold", "wf-done"}, `hold workflow wf-done: .*ended`},
		{[]string{"workflows", "release", "wf-done"}, `release workflow wf-done: .*ended`},
		{[]string{"workflows", "retry", "wf-done"}, `retry workflow wf-done: .*no failed node.*`},
		{[]string{"tasks", "release", "task-later"}, `release task task-later: .*`},
		{[]string{"tasks", "retry", "task-later"}, `retry task task-later: .*`},
		{[]string{"tasks", "rm", "wf-done/a"}, `.*wf-done.*`},
		{[]string{"submit", "demo.echo", "--params", `{"text":"y"}`, "--id", "wf-done"}, `.*wf-done.*`},
	} {
		r := runCLI(ctx, append(tc.args, "--db", dsn)...)
		require.Equal(t, exitFailure, r.code, "%q: %s", tc.args, r.stderr)
		require.Regexp(t, `\Astint: error: `+tc.want+`\n\z`, r.stderr, "%q", tc.args)
		require.NotContains(t, r.stderr, api.ErrConflict.Error(), "%q", tc.args)
		require.NotRegexp(t, regexp.MustCompile(`(?m)^workflow wf-done cancelled`), r.stdout, "%q", tc.args)
		require.Equal(t, before, show(), "%q changed nothing", tc.args)
	}
}
