// Package childtest runs the test binary again as a child process, for
// tests that must kill or freeze a real process (SIGKILL, SIGSTOP): a
// server node that dies mid-run. The child side is the test package's
// TestMain, which sees its environment variables, starts its node and
// prints Ready.
package childtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/store/postgres"
)

// Ready is the line a child prints on stdout once it is up.
const Ready = "ready"

// Child is a running child process.
type Child struct {
	// Cmd is the child's command; its Process is running.
	Cmd   *exec.Cmd
	lines chan string
}

// Start runs the test binary again with env (KEY=value pairs) added to the
// environment, waits up to a minute for it to print Ready, and kills it
// when the test ends. The child's stderr goes to the test's.
func Start(t testing.TB, env ...string) *Child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("childtest: find the test binary: %v", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("childtest: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("childtest: start the child: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := &Child{Cmd: cmd, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	c.Expect(t, Ready)
	return c
}

// Expect waits up to a minute for the child's next line and fails the
// test unless it is want.
func (c *Child) Expect(t testing.TB, want string) {
	t.Helper()
	select {
	case got, ok := <-c.lines:
		if !ok {
			t.Fatalf("childtest: the child exited before printing %q", want)
		}
		if got != want {
			t.Fatalf("childtest: the child printed %q, want %q", got, want)
		}
	case <-time.After(time.Minute):
		t.Fatalf("childtest: the child did not print %q within a minute", want)
	}
}

// Kill kills the child with SIGKILL and reaps it.
func (c *Child) Kill() error {
	if err := c.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	_ = c.Cmd.Wait() // "signal: killed" is the expected outcome
	return nil
}

// Serve is the child's side, called from TestMain: it opens the store at
// dsn, builds a server with newServer, starts it, prints Ready and runs
// until SIGTERM or SIGINT, then stops it gracefully. Any error ends the
// process with status 1. opts go to postgres.Open.
func Serve(dsn string, newServer func(st *postgres.Store) (*impl.Server, error), opts ...postgres.Option) {
	ctx := context.Background()
	st, err := postgres.Open(ctx, dsn, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv, err := newServer(st)
	if err == nil {
		err = srv.Start(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(Ready)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = srv.Stop(stopCtx)
}

// OpenLog opens the child's log file at path for appending, creating it,
// and leaves it open until the process ends; an empty path is io.Discard.
func OpenLog(path string) (io.Writer, error) {
	if path == "" {
		return io.Discard, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("childtest: open the log: %w", err)
	}
	return f, nil
}
