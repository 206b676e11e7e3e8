package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
)

// TestBehaviorsPauseResume: a paused behavior's task waits, saying so,
// behaviors ls shows the pause, and resume lets it run; bad input is
// refused with exit code 2 and changes nothing.
func TestBehaviorsPauseResume(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	startServer(t, ctx, dsn, "pause-node")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pause", "Bad Id"}, "invalid behavior"},
		{[]string{"pause", "acme.unknown"}, `invalid behavior: "acme.unknown" is not registered in stint; known behaviors: cleanup, demo.echo`},
		{[]string{"resume"}, "stint behaviors resume: missing BEHAVIOR"},
		{[]string{"pause", "demo.echo", "extra"}, "takes one argument, BEHAVIOR, not 2"},
		{[]string{"ls", "extra"}, "takes no arguments"},
	} {
		r := runCLI(ctx, append(append([]string{"behaviors"}, tc.args...), "--db", dsn)...)
		require.Equal(t, exitUsage, r.code, "%q: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, "%q", tc.args)
	}
	r := runCLI(ctx, "behaviors", "ls", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `(?m)^BEHAVIOR\s+PAUSED\s+LEASE\s+NODES$`, r.stdout)
	require.Regexp(t, `(?m)^demo\.echo\s+no\s+-\s+pause-node$`, r.stdout, "bad input paused nothing")

	r = runCLI(ctx, "behaviors", "pause", "demo.echo", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "behavior demo.echo paused: its tasks wait until 'stint behaviors resume demo.echo'\n", r.stdout)
	r = runCLI(ctx, "behaviors", "ls", "--json", "--db", dsn)
	requireOK(t, r)
	var page struct {
		Behaviors []behaviorRow `json:"behaviors"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
	var echo behaviorRow
	for _, b := range page.Behaviors {
		if b.Behavior == "demo.echo" {
			echo = b
		}
	}
	require.Equal(t, behaviorRow{Behavior: "demo.echo", Registered: true, Paused: true, Nodes: []string{"pause-node"}}, echo)

	requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"later"}`, "--id", "paused-task", "--db", dsn))
	waitFor(t, 30*time.Second, "the task to say it waits on the pause", func() bool {
		r := runCLI(ctx, "tasks", "show", "paused-task", "--db", dsn)
		return r.code == exitOK && strings.Contains(r.stdout, "waiting: demo.echo is paused")
	})
	r = runCLI(ctx, "behaviors", "resume", "demo.echo", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "behavior demo.echo resumed\n", r.stdout)
	r = runCLI(ctx, "tasks", "wait", "paused-task", "--timeout", "30s", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "task paused-task: success")
	r = runCLI(ctx, "behaviors", "ls", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `(?m)^demo\.echo\s+no\s`, r.stdout)
}

// TestGroupsHoldRelease: a held group key's task waits, groups ls lists
// the key, and release lets the task run; bad input is refused with exit
// code 2 and changes nothing.
func TestGroupsHoldRelease(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	startServer(t, ctx, dsn, "groups-node")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"hold", ""}, "invalid KEY: must be 1 to 256 printable UTF-8 bytes"},
		{[]string{"hold", strings.Repeat("k", 257)}, "invalid KEY"},
		{[]string{"release", "a\x01b"}, "invalid KEY"},
		{[]string{"hold"}, "stint groups hold: missing KEY"},
		{[]string{"ls", "acme"}, "takes no arguments"},
	} {
		r := runCLI(ctx, append(append([]string{"groups"}, tc.args...), "--db", dsn)...)
		require.Equal(t, exitUsage, r.code, "%q: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, "%q", tc.args)
	}
	r := runCLI(ctx, "groups", "ls", "--db", dsn)
	requireOK(t, r)
	require.Empty(t, r.stdout, "bad input held nothing")
	require.Equal(t, "no group keys held\n", r.stderr)

	r = runCLI(ctx, "groups", "hold", "acme corp", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "group 'acme corp' held: its tasks wait until 'stint groups release 'acme corp''\n", r.stdout)
	r = runCLI(ctx, "groups", "ls", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "HELD GROUP KEY\nacme corp\n", r.stdout)
	r = runCLI(ctx, "groups", "ls", "--json", "--db", dsn)
	requireOK(t, r)
	require.JSONEq(t, `{"held_groups": ["acme corp"]}`, r.stdout)

	requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"held"}`, "--id", "grouped-task", "--group", "acme corp", "--db", dsn))
	r = runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"free"}`, "--id", "free-task", "--group", "other", "--wait", "--timeout", "30s", "--db", dsn)
	requireOK(t, r)
	r = runCLI(ctx, "tasks", "show", "grouped-task", "--json", "--db", dsn)
	requireOK(t, r)
	var task api.Task
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &task))
	require.Equal(t, api.StatusScheduled, task.Status, "a task of a held group key waits while one submitted after it ran")
	require.Zero(t, task.Attempt)

	r = runCLI(ctx, "groups", "release", "acme corp", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "group 'acme corp' released\n", r.stdout)
	r = runCLI(ctx, "tasks", "wait", "grouped-task", "--timeout", "30s", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "task grouped-task: success")
	r = runCLI(ctx, "groups", "ls", "--json", "--db", dsn)
	requireOK(t, r)
	require.JSONEq(t, `{"held_groups": []}`, r.stdout)
}
