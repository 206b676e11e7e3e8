package cli

import (
	"encoding/json"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/internal/pgtest"
)

// TestTasksRewindAndFork shows a task's steps, refuses each bad rewind
// and fork with a clear error and no change, then forks the task from
// step 1 and rewinds it to step 2: each runs from its step.
func TestTasksRewindAndFork(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	startServer(t, ctx, dsn, "steps-node")
	requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"hi","steps":3}`, "--id", "counted", "--wait", "--db", dsn))
	show := func(id string) api.Task {
		r := runCLI(ctx, "tasks", "show", id, "--json", "--db", dsn)
		requireOK(t, r)
		var task api.Task
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &task))
		return task
	}
	from := func(task api.Task) int {
		var res demo.EchoResult
		require.NoError(t, json.Unmarshal(task.Result, &res))
		return res.From
	}
	before := show("counted")
	require.Len(t, before.Steps, 3)

	r := runCLI(ctx, "tasks", "show", "counted", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, regexp.MustCompile(`(?m)^steps:\n  1  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}  \{"done":1\}\n  2  .*\{"done":2\}\n  3  .*\{"done":3\}\n\z`), r.stdout)

	for _, tc := range []struct {
		args []string
		code int
		want string // the first line of stderr, a regular expression
	}{
		{[]string{"rewind", "counted"}, exitUsage, `--step is required.*`},
		{[]string{"rewind", "counted", "--step", "0"}, exitUsage, `--step is required.*`},
		{[]string{"rewind", "counted", "--step", "4"}, exitFailure, `rewind task counted: it has no step 4 \(its steps are 1 to 3\)`},
		{[]string{"rewind", "no-such-task", "--step", "1"}, exitFailure, `task no-such-task not found`},
		{[]string{"rewind", "bad id!", "--step", "1"}, exitUsage, `invalid id.*`},
		{[]string{"fork", "counted", "--step", "1"}, exitUsage, `--id is required: name the new task`},
		{[]string{"fork", "counted", "--step", "1", "--id", "no way"}, exitUsage, `invalid --id.*`},
		{[]string{"fork", "counted", "--step", "1", "--id", "counted"}, exitFailure, `fork task counted: task counted exists: fork to a new id`},
	} {
		r := runCLI(ctx, append(append([]string{"tasks"}, tc.args...), "--db", dsn)...)
		require.Equal(t, tc.code, r.code, "%q: %s", tc.args, r.stderr)
		require.Regexp(t, `\Astint: error: `+tc.want+`\n`, r.stderr, "%q", tc.args)
	}
	require.Equal(t, before, show("counted"), "the refusals changed nothing")

	r = runCLI(ctx, "tasks", "fork", "counted", "--step", "1", "--id", "counted-again", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "task counted-again submitted: a copy of task counted from step 1\n", r.stdout)
	requireOK(t, runCLI(ctx, "tasks", "wait", "counted-again", "--db", dsn))
	require.Equal(t, 1, from(show("counted-again")), "the copy ran from step 1")

	r = runCLI(ctx, "tasks", "rewind", "counted", "--step", "2", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "task counted runs again from step 2\n", r.stdout)
	requireOK(t, runCLI(ctx, "tasks", "wait", "counted", "--db", dsn))
	after := show("counted")
	require.Equal(t, 2, from(after), "the rewound task ran from step 2")
	require.Equal(t, before.Steps[:2], after.Steps[:2])
	require.Len(t, after.Steps, 3)
}
