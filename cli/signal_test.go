package cli

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/syncbuf"
	"github.com/stinthq/stint/spi"
)

// approveKind is test.approve: a run sleeps until a signal of the topic
// "approval" comes, and then succeeds with its payload.
var approveKind = api.Kind[struct{}, json.RawMessage]{ID: "test.approve"}

// approveBehavior is test.approve.
type approveBehavior struct{}

func (approveBehavior) Kind() api.Kind[struct{}, json.RawMessage] { return approveKind }

func (approveBehavior) TaskID(ids spi.IDs, _ struct{}) api.TaskID { return ids.Unique() }

func (approveBehavior) Run(ctx context.Context, rc spi.RunContext, _ struct{}) (json.RawMessage, error) {
	sg, ok, err := rc.Receive(ctx, "approval")
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return nil, spi.WaitForSignal("approval", time.Hour)
	}
	return sg.Payload, nil
}

// idleKind is test.idle, which no server of the test runs.
var idleKind = api.Kind[struct{}, struct{}]{ID: "test.idle"}

// idleBehavior is test.idle.
type idleBehavior struct{}

func (idleBehavior) Kind() api.Kind[struct{}, struct{}] { return idleKind }

func (idleBehavior) TaskID(ids spi.IDs, _ struct{}) api.TaskID { return ids.Unique() }

func (idleBehavior) Run(context.Context, spi.RunContext, struct{}) (struct{}, error) {
	return struct{}{}, nil
}

// runCLIOn runs the command line with the behaviors of reg, reading stdin.
func runCLIOn(ctx context.Context, reg *spi.Registry, stdin io.Reader, args ...string) result {
	var stdout, stderr syncbuf.Buffer
	code := Run(ctx, args, reg, stdin, &stdout, &stderr)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// TestSignalCommand: stint signal sends a message with a payload (inline,
// from standard input, or none) and a key, which tasks show lists with the
// task's events; bad input exits 2, an unknown or finished task 1, and
// neither stores anything.
func TestSignalCommand(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	reg := spi.NewRegistry()
	spi.MustRegister(reg, spi.Behavior[struct{}, struct{}](idleBehavior{}))
	cmd := func(stdin string, args ...string) result {
		return runCLIOn(ctx, reg, strings.NewReader(stdin), append(args, "--db", dsn)...)
	}
	requireOK(t, cmd("", "migrate", "up"))
	requireOK(t, cmd("", "submit", "test.idle", "--id", "orders/1"))
	requireOK(t, cmd("", "submit", "test.idle", "--id", "done"))
	requireOK(t, cmd("", "tasks", "fail", "done", "--reason", "finished for good"))
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	pending := func(id string) int {
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM stint_signal WHERE task_id = $1`, id).Scan(&n))
		return n
	}

	r := cmd("", "signal", "orders/1", "bank/paid", `{"amount": 12}`)
	requireOK(t, r)
	require.Equal(t, "signal bank/paid sent to task orders/1\n", r.stdout)
	r = cmd(`{"n": 1}`, "signal", "orders/1", "note", "-", "--key", "hook-1")
	requireOK(t, r)
	require.Equal(t, "signal note sent to task orders/1 (key hook-1)\n", r.stdout)
	requireOK(t, cmd("", "signal", "orders/1", "note", `{"n": 2}`, "--key", "hook-1")) // the key again: nothing stored
	file := filepath.Join(t.TempDir(), "payload.json")
	require.NoError(t, os.WriteFile(file, []byte(`"from a file"`), 0o600))
	requireOK(t, cmd("", "signal", "orders/1", "file", "@"+file))
	requireOK(t, cmd("", "signal", "orders/1", "empty"))
	require.Equal(t, 4, pending("orders/1"))

	// As a run's statement sets it.
	_, err = conn.Exec(ctx, `INSERT INTO stint_event (task_id, key, value, at, created)
		SELECT id, 'preview', '{"url": "/p/1"}', now(), created_at FROM stint_task WHERE id = 'orders/1'`)
	require.NoError(t, err)
	r = cmd("", "tasks", "show", "orders/1")
	requireOK(t, r)
	require.Contains(t, r.stdout, "signals (not consumed yet, oldest first):\n")
	require.Regexp(t, `(?m)^  bank/paid\s+key -\s+\S+ \S+\s+\{"amount":12\}$`, r.stdout)
	require.Regexp(t, `(?m)^  note\s+key hook-1\s+\S+ \S+\s+\{"n":1\}$`, r.stdout)
	require.Regexp(t, `(?m)^  file\s+key -\s+\S+ \S+\s+"from a file"$`, r.stdout)
	require.Regexp(t, `(?m)^  empty\s+key -\s+\S+ \S+\s+null$`, r.stdout)
	require.Regexp(t, `(?m)^events:\n  preview\s+\S+ \S+\s+\{"url":"/p/1"\}$`, r.stdout)

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"signal"}, exitUsage, "takes a task's ID, a TOPIC and, optionally, a PAYLOAD; got 0 arguments"},
		{[]string{"signal", "orders/1"}, exitUsage, "got 1 arguments"},
		{[]string{"signal", "orders/1", "t", "1", "2"}, exitUsage, "got 4 arguments"},
		{[]string{"signal", "orders/1", "bad topic"}, exitUsage, `invalid topic: "bad topic" must be 1 to 128 characters`},
		{[]string{"signal", "orders/1", "t", "yes"}, exitUsage, "invalid payload: malformed JSON in PAYLOAD"},
		{[]string{"signal", "orders/1", "t", "@/no/such/file"}, exitUsage, "PAYLOAD @/no/such/file: cannot read the payload"},
		{[]string{"signal", "orders/1", "t", "--key", "bad key"}, exitUsage, "invalid key"},
		{[]string{"signal", "bad id", "t"}, exitUsage, "invalid id"},
		{[]string{"signal", "--workflow", "wf", "t"}, exitUsage, "--workflow and --node go together"},
		{[]string{"signal", "--workflow", "wf", "--node", "n"}, exitUsage, "takes a TOPIC and, optionally, a PAYLOAD; got 0 arguments"},
		{[]string{"signal", "no-such-task", "t"}, exitFailure, "task no-such-task not found"},
		{[]string{"signal", "done", "t"}, exitFailure, "signal task done: it has finished\n"},
		{[]string{"signal", "--workflow", "no-such-wf", "--node", "n", "t"}, exitFailure, "workflow no-such-wf not found"},
	} {
		r := cmd("", c.args...)
		require.Equal(t, c.code, r.code, "%q: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.want, "%q", c.args)
	}
	require.Equal(t, 4, pending("orders/1"), "bad input stored nothing")
	require.Zero(t, pending("done"))

	r = cmd("", "signal", "--help")
	requireOK(t, r)
	require.Contains(t, r.stdout, "stint signal --workflow release-7 --node approve approval")
}

// TestSignalWakesTaskFromTheCommandLine: a task asleep on a signal shows
// the wait in tasks ls, tasks show and workflows show; stint signal wakes
// it, by its id, and a gate of a workflow submitted from a file by the
// workflow's id and the node's name.
func TestSignalWakesTaskFromTheCommandLine(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	reg := spi.NewRegistry()
	spi.MustRegister(reg, spi.Behavior[struct{}, json.RawMessage](approveBehavior{}))
	cmd := func(args ...string) result {
		return runCLIOn(ctx, reg, strings.NewReader(""), append(args, "--db", dsn)...)
	}
	requireOK(t, cmd("migrate", "up"))
	startServerWith(t, ctx, dsn, "signal-node", reg)
	requireOK(t, cmd("submit", "test.approve", "--id", "order-7"))
	var r result
	waitFor(t, time.Minute, "the task to sleep on its signal", func() bool {
		r = cmd("tasks", "show", "order-7")
		return strings.Contains(r.stdout, "scheduled, waiting for signal approval")
	})
	requireOK(t, r)
	r = cmd("tasks", "ls", "--behavior", "test.approve")
	requireOK(t, r)
	require.Regexp(t, `order-7\s+test.approve\s+waiting \(signal approval\)`, r.stdout)
	requireOK(t, cmd("signal", "order-7", "approval", `{"by": "ann"}`))
	r = cmd("tasks", "wait", "order-7", "--timeout", "1m")
	requireOK(t, r)
	require.Contains(t, r.stdout, `"by": "ann"`)

	wf := filepath.Join(t.TempDir(), "wf.json")
	require.NoError(t, os.WriteFile(wf, []byte(`{"id": "release-7", "nodes": [{"name": "approve", "task": {}, "gate": {"topic": "approval", "timeout": "72h"}}]}`), 0o600))
	requireOK(t, cmd("workflows", "submit", wf))
	waitFor(t, time.Minute, "the node to sleep on its signal", func() bool {
		r = cmd("workflows", "show", "release-7")
		return strings.Contains(r.stdout, "waits for signal approval")
	})
	require.Regexp(t, `approve\s+waiting \(signal approval\)`, r.stdout)
	r = cmd("signal", "--workflow", "release-7", "--node", "deploy", "approval")
	require.Equal(t, exitFailure, r.code, r.stderr)
	require.Contains(t, r.stderr, `workflow release-7 has no node "deploy"`)
	r = cmd("signal", "--workflow", "release-7", "--node", "approve", "approval", `{"ok": true}`)
	requireOK(t, r)
	require.Equal(t, "signal approval sent to task release-7/approve\n", r.stdout)
	waitFor(t, time.Minute, "the workflow to succeed", func() bool {
		return strings.Contains(cmd("workflows", "show", "release-7").stdout, "workflow release-7: succeeded")
	})
}

// reopenApproveKind is test.reopen_approve: test.approve whose policy
// reopens its finished tasks on a signal (spi.Policy.ReopenOnSignal).
var reopenApproveKind = api.Kind[struct{}, json.RawMessage]{ID: "test.reopen_approve"}

// reopenApproveBehavior is test.reopen_approve.
type reopenApproveBehavior struct{ approveBehavior }

func (reopenApproveBehavior) Kind() api.Kind[struct{}, json.RawMessage] { return reopenApproveKind }

func (reopenApproveBehavior) Policy() spi.Policy { return spi.Policy{ReopenOnSignal: true} }

// TestSignalReopensFromTheCommandLine: stint signal to a finished task
// whose behavior reopens on a signal exits 0 and runs the task again,
// whose run receives the message; a program that does not hold the
// behavior exits 1, as for any finished task, and stores nothing.
func TestSignalReopensFromTheCommandLine(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	reg := spi.NewRegistry()
	spi.MustRegister(reg, spi.Behavior[struct{}, json.RawMessage](reopenApproveBehavior{}))
	cmd := func(reg *spi.Registry, args ...string) result {
		return runCLIOn(ctx, reg, strings.NewReader(""), append(args, "--db", dsn)...)
	}
	requireOK(t, cmd(reg, "migrate", "up"))
	startServerWith(t, ctx, dsn, "reopen-node", reg)
	requireOK(t, cmd(reg, "submit", "test.reopen_approve", "--id", "order-8"))
	requireOK(t, cmd(reg, "signal", "order-8", "approval", `{"by": "ann"}`))
	r := cmd(reg, "tasks", "wait", "order-8", "--timeout", "1m")
	requireOK(t, r)
	require.Contains(t, r.stdout, `"by": "ann"`)

	r = cmd(nil, "signal", "order-8", "approval", `{"by": "eve"}`) // the oldest message, had it been stored
	require.Equal(t, exitFailure, r.code, r.stderr)
	require.Contains(t, r.stderr, "finished")
	r = cmd(reg, "signal", "order-8", "approval", `{"by": "bob"}`)
	requireOK(t, r)
	require.Equal(t, "signal approval sent to task order-8\n", r.stdout)
	r = cmd(reg, "tasks", "wait", "order-8", "--timeout", "1m")
	requireOK(t, r)
	require.Contains(t, r.stdout, `"by": "bob"`)
}
