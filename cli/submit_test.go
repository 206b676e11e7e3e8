package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/syncbuf"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// taskIDOf returns the id in the "task ID: ..." line submit prints.
func taskIDOf(t *testing.T, stdout string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^task (\S+): `).FindStringSubmatch(stdout)
	require.NotNil(t, m, "no task line in:\n%s", stdout)
	return m[1]
}

func TestSubmitWaitPrintsEchoResult(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	startServer(t, ctx, dsn, "node-a")

	r := runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"hi","upper":true}`, "--wait", "--db", dsn)
	requireOK(t, r)
	id := taskIDOf(t, r.stdout)
	require.Contains(t, r.stdout, "task "+id+": created (status scheduled)")
	require.Contains(t, r.stdout, "task "+id+": success (attempt 1 on node-a)")
	require.Contains(t, r.stdout, `"text": "HI"`)

	// The same from a file, with --json: two lines, the submission and the
	// finished task.
	file := filepath.Join(t.TempDir(), "params.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"text":"from a file"}`), 0o600))
	r = runCLI(ctx, "submit", "demo.echo", "--params", "@"+file, "--id", "echo-from-file", "--priority", "3",
		"--group", "g1", "--wait", "--json", "--db", dsn)
	requireOK(t, r)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 2, r.stdout)
	var sub api.Submission
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &sub))
	require.Equal(t, api.Submission{ID: "echo-from-file", Created: true, Status: api.StatusScheduled}, sub)
	var task api.Task
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &task))
	require.Equal(t, api.StatusSuccess, task.Status)
	require.Equal(t, 3, task.Priority)
	require.Equal(t, "g1", task.GroupKey)
	require.JSONEq(t, `{"text":"from a file","attempt":1}`, string(task.Result))

	// Submitting the id again merges into the finished task, which runs
	// again.
	r = runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"again"}`, "--id", "echo-from-file", "--wait", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "task echo-from-file: exists; the submit was merged into it")
	require.Contains(t, r.stdout, "task echo-from-file: success")
	require.Contains(t, r.stdout, `"text": "again"`)
}

// TestSubmitWaitShowsProgressAndTimesOut: a task that no live node runs
// stays scheduled, and both the progress of --wait and `tasks show` say
// why, with which nodes run what.
func TestSubmitWaitShowsProgressAndTimesOut(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	st, err := postgres.Open(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	require.NoError(t, st.RegisterNode(ctx, store.Node{ID: "node-other", Host: "h", PID: 1, MaxWorkers: 1,
		Behaviors: []api.BehaviorID{"cleanup"}}))

	// No server runs demo.echo, so the task stays scheduled.
	r := runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"nobody runs me"}`, "--wait", "--timeout", "1500ms", "--db", dsn)
	require.Equal(t, exitFailure, r.code, r.stderr)
	id := taskIDOf(t, r.stdout)
	require.Contains(t, r.stderr, "waiting for task "+id+": scheduled, waiting: no live node runs demo.echo (node-other runs cleanup)\n")
	require.Contains(t, r.stderr, "gave up waiting for task "+id+" after 1.5s")
	require.Equal(t, 1, countTasks(t, ctx, dsn), "the task stays stored")

	r = runCLI(ctx, "tasks", "show", id, "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `(?m)^status:\s+scheduled, waiting: no live node runs demo\.echo \(node-other runs cleanup\)$`, r.stdout)
}

func TestSubmitBadInputStoresNothing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"malformed JSON", []string{"demo.echo", "--params", `{"text":`}, "invalid params: malformed JSON"},
		{"missing params file", []string{"demo.echo", "--params", "@missing-file"}, "--params @missing-file: cannot read the params"},
		{"unknown behavior", []string{"demo.nope", "--params", `{"text":"x"}`}, `invalid behavior: "demo.nope" is not registered; known behaviors: cleanup, demo.echo,`},
		{"malformed behavior", []string{"Demo!", "--params", `{"text":"x"}`}, "invalid behavior"},
		{"missing required param", []string{"demo.echo", "--params", `{}`}, "invalid params.text: is required"},
		{"no params", []string{"demo.echo"}, "invalid params.text: is required"},
		{"unknown param", []string{"demo.echo", "--params", `{"text":"x","bogus":1}`}, "invalid params.bogus: unknown field"},
		{"wrong param type", []string{"demo.echo", "--params", `{"text":5}`}, "invalid params.text: must be a string, got a number"},
		{"param out of range", []string{"demo.echo", "--params", `{"text":"x","delay_ms":-1}`}, "invalid params.delay_ms: must be at least 0"},
		{"bad id", []string{"demo.echo", "--params", `{"text":"x"}`, "--id", "a"}, `invalid id: "a" must be 3 to 128 characters`},
		{"negative delay", []string{"demo.echo", "--params", `{"text":"x"}`, "--delay=-5s"}, "--delay -5s is negative"},
		{"malformed delay", []string{"demo.echo", "--params", `{"text":"x"}`, "--delay", "soon"}, `invalid argument "soon" for "--delay"`},
		{"negative retention", []string{"demo.echo", "--params", `{"text":"x"}`, "--retention=-1h"}, "--retention -1h0m0s is negative"},
		{"retention too long", []string{"demo.echo", "--params", `{"text":"x"}`, "--retention", "900000h"}, "submit demo.echo: invalid retention: 900000h0m0s is outside 0.."},
		{"priority out of range", []string{"demo.echo", "--params", `{"text":"x"}`, "--priority", "40000"}, "--priority 40000 is outside 0..32767"},
		{"malformed priority", []string{"demo.echo", "--params", `{"text":"x"}`, "--priority", "high"}, `invalid argument "high" for "--priority"`},
		{"timeout without wait", []string{"demo.echo", "--params", `{"text":"x"}`, "--timeout", "1s"}, "--timeout needs --wait"},
		{"debounce without a maximum", []string{"demo.echo", "--params", `{"text":"x"}`, "--id", "deb", "--debounce", "5s"}, "--debounce needs --debounce-max"},
		{"a maximum without debounce", []string{"demo.echo", "--params", `{"text":"x"}`, "--id", "deb", "--debounce-max", "5s"}, "--debounce-max needs --debounce"},
		{"debounce over its maximum", []string{"demo.echo", "--params", `{"text":"x"}`, "--id", "deb", "--debounce", "5s", "--debounce-max", "1s"},
			"submit demo.echo: invalid debounce.max_wait: 1s is under the window, 5s"},
		{"debounce without an id that repeats", []string{"demo.echo", "--params", `{"text":"x"}`, "--debounce", "5s", "--debounce-max", "1m"},
			"submit demo.echo: invalid debounce: demo.echo gives every task a new id"},
		{"two behaviors", []string{"demo.echo", "demo.echo"}, `stint submit takes one argument, BEHAVIOR, not 2: "demo.echo" "demo.echo"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(ctx, append(append([]string{"submit"}, tc.args...), "--db", dsn)...)
			require.Equal(t, exitUsage, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			require.Contains(t, r.stderr, "stint: error: "+tc.want)
			require.Empty(t, r.stdout)
			require.Zero(t, countTasks(t, ctx, dsn), "a bad submit must store nothing")
		})
	}
}

// Debounced submits of one id store one task, due a window after the
// last of them, with the last params.
func TestSubmitDebounced(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	for _, text := range []string{"first", "last"} {
		requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"`+text+`"}`, "--id", "deb-cli",
			"--debounce", "1h", "--debounce-max", "2h", "--db", dsn))
	}
	r := runCLI(ctx, "tasks", "show", "deb-cli", "--json", "--db", dsn)
	requireOK(t, r)
	var task api.Task
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &task))
	require.JSONEq(t, `{"text":"last"}`, string(task.Params))
	require.WithinDuration(t, time.Now().Add(time.Hour), *task.ScheduleNotBefore, time.Minute)
	require.Equal(t, 1, countTasks(t, ctx, dsn))
}

func TestSubmitWithRetention(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"kept"}`, "--id", "kept-a-day", "--delay", "1h", "--retention", "24h", "--db", dsn))
	r := runCLI(ctx, "tasks", "show", "kept-a-day", "--json", "--db", dsn)
	requireOK(t, r)
	var task api.Task
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &task))
	require.Equal(t, 24*time.Hour, task.Retention)
}

func TestSubmitParamsFromStdin(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	var stdout, stderr syncbuf.Buffer
	args := []string{"submit", "demo.echo", "--params", "@-", "--json", "--db", dsn}
	require.Equal(t, exitOK, Run(ctx, args, nil, strings.NewReader(`{"text":"piped"}`), &stdout, &stderr), stderr.String())
	var sub api.Submission
	require.NoError(t, json.Unmarshal([]byte(stdout.String()), &sub))
	require.True(t, sub.Created)
	r := runCLI(ctx, "tasks", "show", string(sub.ID), "--json", "--db", dsn)
	requireOK(t, r)
	var task api.Task
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &task))
	require.JSONEq(t, `{"text":"piped"}`, string(task.Params))
}
