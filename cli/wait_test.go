package cli

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/syncbuf"
)

// TestSignalStopsAWait runs each command that waits as a process named
// stint, against a database no server works on, and stops it with a
// signal once it waits: it says where the task, workflow or batch goes on
// and exits 128 and the signal's number (130 for Ctrl-C), without an
// error.
func TestSignalStopsAWait(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 3*time.Minute)
	dsn := pgtest.New(t)
	self, err := os.Executable()
	require.NoError(t, err)
	dir := t.TempDir()
	stint := filepath.Join(dir, "stint")
	require.NoError(t, os.Symlink(self, stint))
	wf := filepath.Join(dir, "wf.json")
	require.NoError(t, os.WriteFile(wf, []byte(`{"id": "wf-waited", "nodes": [
		{"name": "a", "task": {"behavior": "demo.echo", "params": {"text": "a"}}}]}`), 0o600))
	requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"w"}`, "--id", "task-waited", "--db", dsn))

	for _, tc := range []struct {
		args    []string
		waiting string // stderr once it waits
		sig     syscall.Signal
		want    string // the last line of stderr
	}{
		{[]string{"submit", "demo.echo", "--params", `{"text":"x"}`, "--id", "task-submitted", "--wait"}, "waiting for task task-submitted",
			syscall.SIGINT, "stopped waiting for task task-submitted; it runs on: stint tasks show task-submitted"},
		{[]string{"submit", "demo.echo", "--params", `{"text":"x"}`, "--id", "task-timed", "--wait", "--timeout", "1h"}, "waiting for task task-timed",
			syscall.SIGINT, "stopped waiting for task task-timed; it runs on: stint tasks show task-timed"},
		{[]string{"tasks", "wait", "task-waited"}, "waiting for task task-waited",
			syscall.SIGTERM, "stopped waiting for task task-waited; it runs on: stint tasks show task-waited"},
		{[]string{"workflows", "submit", wf, "--wait"}, "wf-waited",
			syscall.SIGINT, "stopped waiting for workflow wf-waited; it runs on: stint workflows show wf-waited"},
		{[]string{"ingest", "submit", "--profile", "p", "--submitter", "me", "--url", "http://127.0.0.1:1/a.txt", "--wait"}, "waiting for task ",
			syscall.SIGINT, "stopped waiting for batch "},
	} {
		var stdout, stderr syncbuf.Buffer
		cmd := exec.CommandContext(ctx, stint, append(tc.args, "--db", dsn)...)
		cmd.Env = append(os.Environ(), "STINT_CLI_TEST_MAIN=1", "STINT_DATABASE_URL=")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Start())
		waitFor(t, time.Minute, "the command to wait", func() bool {
			return strings.Contains(stdout.String()+stderr.String(), tc.waiting)
		})
		require.NoError(t, cmd.Process.Signal(tc.sig))
		err := cmd.Wait()
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "%q: %v\n%s", tc.args, err, stderr.String())
		require.Equal(t, 128+int(tc.sig), exit.ExitCode(), "%q: %s", tc.args, stderr.String())
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		require.Contains(t, lines[len(lines)-1], tc.want, "%q", tc.args)
		require.NotContains(t, stderr.String(), "error", "%q", tc.args)
		require.NotContains(t, stderr.String(), "context canceled", "%q", tc.args)
	}

	// Run's caller ending the context stops the wait the same way.
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan result, 1)
	var stdout, stderr syncbuf.Buffer
	go func() {
		code := Run(runCtx, []string{"tasks", "wait", "task-waited", "--db", dsn}, nil, strings.NewReader(""), &stdout, &stderr)
		done <- result{stdout: stdout.String(), stderr: stderr.String(), code: code}
	}()
	waitFor(t, time.Minute, "tasks wait to wait", func() bool { return strings.Contains(stderr.String(), "waiting for task task-waited") })
	cancel()
	r := <-done
	require.Equal(t, exitInterrupted, r.code, r.stderr)
	require.Contains(t, r.stderr, "stopped waiting for task task-waited; it runs on: stint tasks show task-waited\n")
}
