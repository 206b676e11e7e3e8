package cli

import (
	"encoding/json"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
)

func TestTasksLsAndShow(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	startServer(t, ctx, dsn, "node-ls")

	r := runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"listed"}`, "--id", "task-listed", "--group", "grp", "--wait", "--db", dsn)
	requireOK(t, r)

	// The server also submitted the cleanup singleton: list demo.echo only.
	r = runCLI(ctx, "tasks", "ls", "--behavior", "demo.echo", "--db", dsn)
	requireOK(t, r)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 2, r.stdout)
	require.Regexp(t, `^ID\s+BEHAVIOR\s+STATUS\s+PRIORITY\s+ATTEMPT\s+NODE\s+UPDATED$`, lines[0])
	require.Regexp(t, `^task-listed\s+demo\.echo\s+success\s+5\s+1\s+node-ls\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`, lines[1])

	r = runCLI(ctx, "tasks", "ls", "--behavior", "demo.echo", "--status", "success", "--group", "grp", "--json", "--db", dsn)
	requireOK(t, r)
	var page api.Page
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
	require.Len(t, page.Tasks, 1)
	require.Equal(t, api.TaskID("task-listed"), page.Tasks[0].ID)
	require.Empty(t, page.Next)

	r = runCLI(ctx, "tasks", "ls", "--status", "failure", "--db", dsn)
	requireOK(t, r)
	require.Empty(t, r.stdout)
	require.Contains(t, r.stderr, "no tasks match")

	r = runCLI(ctx, "tasks", "show", "task-listed", "--db", dsn)
	requireOK(t, r)
	for _, want := range []string{
		`(?m)^id:\s+task-listed$`,
		`(?m)^behavior:\s+demo\.echo$`,
		`(?m)^status:\s+success$`,
		`(?m)^finished:\s+true$`,
		`(?m)^attempt:\s+1$`,
		`(?m)^node:\s+node-ls$`,
		`(?m)^group:\s+grp$`,
		`(?m)^due:\s+-$`,
		`(?m)^executed:\s+\d{4}-`,
		`(?m)^params: \{\n  "text": "listed"\n\}$`,
		`(?m)^result: \{\n  "text": "listed",\n  "attempt": 1\n\}$`,
		`(?m)^error: -$`,
		`(?m)^progress: -$`,
	} {
		require.Regexp(t, regexp.MustCompile(want), r.stdout)
	}

	r = runCLI(ctx, "tasks", "show", "task-listed", "--json", "--db", dsn)
	requireOK(t, r)
	var task api.Task
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &task))
	require.Equal(t, api.StatusSuccess, task.Status)
	require.Equal(t, "node-ls", task.Node)

	r = runCLI(ctx, "tasks", "show", "no-such-task", "--db", dsn)
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "stint: error: task no-such-task not found")

	r = runCLI(ctx, "tasks", "show", "x", "--db", dsn)
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "invalid id")
}

func TestTasksLsPages(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	for _, id := range []string{"page-1", "page-2", "page-3"} {
		requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"x"}`, "--id", id, "--db", dsn))
	}
	r := runCLI(ctx, "tasks", "ls", "--limit", "2", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "page-1")
	require.Contains(t, r.stdout, "page-2")
	require.NotContains(t, r.stdout, "page-3")
	require.Contains(t, r.stdout, "next: page-2 (more tasks match: pass --after page-2)")

	r = runCLI(ctx, "tasks", "ls", "--limit", "2", "--after", "page-2", "--json", "--db", dsn)
	requireOK(t, r)
	var page api.Page
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
	require.Len(t, page.Tasks, 1)
	require.Equal(t, api.TaskID("page-3"), page.Tasks[0].ID)
	require.Equal(t, api.StatusScheduled, page.Tasks[0].Status)
}

func TestTasksLsBadFlags(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--limit", "0"}, "--limit 0 is outside 1..1000"},
		{[]string{"--limit", "1001"}, "--limit 1001 is outside 1..1000"},
		{[]string{"--limit", "many"}, `invalid argument "many" for "--limit"`},
		{[]string{"--status", "done"}, `--status "done" is not a task state`},
		{[]string{"extra"}, "takes no arguments"},
	} {
		r := runCLI(ctx, append(append([]string{"tasks", "ls"}, tc.args...), "--db", dsn)...)
		require.Equal(t, exitUsage, r.code, "args %q: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want)
	}
}

// TestTasksLsNamesEveryStatus: the help of tasks ls --status and its error
// for a bad one list every status a task may be in, and each is accepted.
func TestTasksLsNamesEveryStatus(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	help := runCLI(ctx, "tasks", "ls", "--help")
	requireOK(t, help)
	bad := runCLI(ctx, "tasks", "ls", "--status", "done", "--db", dsn)
	require.Equal(t, exitUsage, bad.code, bad.stderr)
	var names []string
	for _, s := range api.Statuses() {
		names = append(names, string(s))
		requireOK(t, runCLI(ctx, "tasks", "ls", "--status", string(s), "--db", dsn))
	}
	require.Contains(t, names, string(api.StatusWaiting))
	list := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	require.Contains(t, help.stdout, "only tasks in this state: "+list)
	require.Contains(t, bad.stderr, `--status "done" is not a task state: want `+list)
}

func TestTaskActions(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)

	r := runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"later"}`, "--id", "task-act", "--delay", "1h", "--db", dsn)
	requireOK(t, r)
	status := func() string {
		r := runCLI(ctx, "tasks", "show", "task-act", "--json", "--db", dsn)
		requireOK(t, r)
		var task api.Task
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &task))
		return string(task.Status)
	}

	r = runCLI(ctx, "tasks", "hold", "task-act", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "task task-act held\n", r.stdout)
	require.Equal(t, "held", status())

	r = runCLI(ctx, "tasks", "hold", "task-act", "--db", dsn)
	require.Equal(t, exitFailure, r.code, "holding a held task conflicts")
	require.Contains(t, r.stderr, "it is held")

	r = runCLI(ctx, "tasks", "hold", "task-act", "--db", dsn)
	require.Equal(t, exitFailure, r.code)
	require.Equal(t, "stint: error: hold task task-act: it is held\n", r.stderr, "the error names the action once")

	r = runCLI(ctx, "tasks", "release", "task-act", "--db", dsn)
	requireOK(t, r)
	require.Empty(t, r.stderr, "the release's notification goes out before the command closes its pool")
	require.Equal(t, "scheduled", status())

	r = runCLI(ctx, "tasks", "retry", "task-act", "--db", dsn)
	require.Equal(t, exitFailure, r.code, "only a failed task can be retried")

	r = runCLI(ctx, "tasks", "rm", "task-act", "--db", dsn)
	requireOK(t, r)
	r = runCLI(ctx, "tasks", "rm", "task-act", "--db", dsn)
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "task task-act not found")

	r = runCLI(ctx, "tasks", "rm", "bad id!", "--db", dsn)
	require.Equal(t, exitUsage, r.code)
}

func TestTasksWaitAndStats(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)

	r := runCLI(ctx, "stats", "--db", dsn)
	requireOK(t, r)
	require.Empty(t, r.stdout, "no empty tables")
	require.Equal(t, "no tasks\n", r.stderr)

	r = runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"waited","delay_ms":200}`, "--id", "task-waited", "--db", dsn)
	requireOK(t, r)
	r = runCLI(ctx, "stats", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `(?m)^demo\.echo\s+scheduled\s+1$`, r.stdout)
	require.Regexp(t, `(?m)^demo\.echo\s+1\s+\S+$`, r.stdout, "one task due now")

	r = runCLI(ctx, "tasks", "wait", "task-waited", "--timeout", "100ms", "--db", dsn)
	require.Equal(t, exitFailure, r.code, "no server runs it: the wait times out")

	startServer(t, ctx, dsn, "node-wait")
	r = runCLI(ctx, "tasks", "wait", "task-waited", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "task task-waited: success")
	require.Contains(t, r.stdout, `"text": "waited"`)

	r = runCLI(ctx, "tasks", "wait", "no-such-task", "--db", dsn)
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "task no-such-task not found")
	r = runCLI(ctx, "tasks", "wait", "bad id!", "--db", dsn)
	require.Equal(t, exitUsage, r.code)

	r = runCLI(ctx, "stats", "--json", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, `"counts"`)
}

func TestRetryingTaskIsShownApartFromAFailure(t *testing.T) {
	t.Parallel()
	c, err := newCLI("stint", io.Discard, io.Discard, nil)
	require.NoError(t, err)
	next := time.Date(2030, 1, 2, 3, 4, 5, 0, time.Local)
	retrying := api.Task{ID: "task-r", Behavior: "demo.echo", Status: api.StatusFailure, Attempt: 2, Errors: 2,
		ScheduleNotBefore: &next, Error: &api.TaskError{Retryable: true, Message: "connection refused"}}
	require.True(t, retrying.Retrying())
	want := "retrying (attempt 2 of 10, next at 2030-01-02 03:04:05): connection refused"
	require.Equal(t, want, c.statusText(retrying))
	require.Equal(t, "waiting for task task-r: "+want, c.progressLine(retrying))
	require.Equal(t, "retrying", shortStatus(retrying))

	failed := retrying
	failed.ScheduleNotBefore = nil
	require.False(t, failed.Retrying())
	require.Equal(t, "failure", c.statusText(failed))
	require.Equal(t, "failure", shortStatus(failed))
}

// TestATaskWaitingForANewerNodeSaysSo: a task of a newer release of its
// behavior than the live nodes run shows the version it waits for in the
// list, and the whole reason in the task's own text.
func TestATaskWaitingForANewerNodeSaysSo(t *testing.T) {
	t.Parallel()
	c, err := newCLI("stint", io.Discard, io.Discard, nil)
	require.NoError(t, err)
	now := time.Now()
	task := api.Task{ID: "task-v", Behavior: "demo.echo", Status: api.StatusScheduled, ScheduleNotBefore: &now, Version: 3,
		Waiting: &api.Wait{Reason: api.WaitNoNode, Limit: "demo.echo", Version: 3, Detail: "no live node runs demo.echo version 3 (nodes run 2)"}}
	require.Equal(t, "waiting (a node of version 3)", shortStatus(task))
	require.Equal(t, "scheduled, waiting for a node of a newer release: no live node runs demo.echo version 3 (nodes run 2)", c.statusText(task))
	task.Waiting = &api.Wait{Reason: api.WaitGroupHeld, Key: "k"}
	require.Equal(t, "scheduled, waiting: its group k is held", c.statusText(task))
	task.Waiting = &api.Wait{Reason: "some_new_reason", Key: "k"}
	require.Equal(t, "scheduled, waiting (some new reason) (key k)", c.statusText(task), "a reason this release does not know")
}

// TestJSONListsAreObjects: every list command's --json is an object with a
// named array, as the HTTP API's lists are, empty lists included.
func TestJSONListsAreObjects(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	for _, tc := range []struct {
		args []string
		key  string
	}{
		{[]string{"tasks", "ls"}, "tasks"},
		{[]string{"nodes", "ls"}, "nodes"},
		{[]string{"replications", "ls"}, "replications"},
		{[]string{"batches", "ls"}, "batches"},
	} {
		r := runCLI(ctx, append(tc.args, "--json", "--db", dsn)...)
		requireOK(t, r)
		var obj map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &obj), "%v: %s", tc.args, r.stdout)
		require.Equal(t, "[]", string(obj[tc.key]), "%v: %s", tc.args, r.stdout)
	}
}

func TestTasksFail(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"later"}`, "--id", "task-fail", "--delay", "1h", "--db", dsn))
	show := func() api.Task {
		r := runCLI(ctx, "tasks", "show", "task-fail", "--json", "--db", dsn)
		requireOK(t, r)
		var task api.Task
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &task))
		return task
	}

	// Bad input is refused before anything changes.
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"task-fail"}, exitUsage, "--reason is required"},
		{[]string{"task-fail", "--reason", "  "}, exitUsage, "--reason is required"},
		{[]string{"task-fail", "--reason", "two\nlines"}, exitUsage, "invalid reason"},
		{[]string{"x", "--reason", "r"}, exitUsage, "invalid id"},
		{[]string{"--reason", "r"}, exitUsage, "ID"},
		{[]string{"no-such-task", "--reason", "r"}, exitFailure, "task no-such-task not found"},
	} {
		r := runCLI(ctx, append(append([]string{"tasks", "fail"}, tc.args...), "--db", dsn)...)
		require.Equal(t, tc.code, r.code, "%v: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, tc.args)
	}
	require.Equal(t, api.StatusScheduled, show().Status, "the refusals changed nothing")

	r := runCLI(ctx, "tasks", "fail", "task-fail", "--reason", "known bad input", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "task task-fail failed\n", r.stdout)
	task := show()
	require.Equal(t, api.StatusFailure, task.Status)
	require.True(t, task.Finished())
	require.Equal(t, &api.TaskError{Code: api.FailedByHand, Message: "failed by hand: known bad input"}, task.Error)

	r = runCLI(ctx, "tasks", "fail", "task-fail", "--reason", "again", "--db", dsn)
	require.Equal(t, exitFailure, r.code)
	require.Equal(t, "stint: error: fail task task-fail: it has finished for good (failure)\n", r.stderr)
}
