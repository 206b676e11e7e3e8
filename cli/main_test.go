package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/syncbuf"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// TestMain gives the ingest behaviors of the servers the tests start a
// directory of this test binary's own, removed at the end, instead of the
// default one shared by every process on the machine. Run with
// STINT_CLI_TEST_MAIN=1, the test binary is a program calling Main, under
// whatever name it was run as (see TestProgramNamesItself).
func TestMain(m *testing.M) {
	if os.Getenv("STINT_CLI_TEST_MAIN") == "1" {
		Main(nil)
	}
	dir, err := os.MkdirTemp("", "stint-cmd-test-ingest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv(envIngestDir, dir)
	code := pgtest.RunWithExamples(m)
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// result is what one run of the CLI printed and its exit code.
type result struct {
	stdout, stderr string
	code           int
}

// runCLI runs the stint command line with args in-process.
func runCLI(ctx context.Context, args ...string) result {
	var stdout, stderr syncbuf.Buffer
	code := Run(ctx, args, nil, strings.NewReader(""), &stdout, &stderr)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// runCLIWith is runCLI with the run's state changed by mod first.
func runCLIWith(ctx context.Context, mod func(*cli), args ...string) result {
	var stdout, stderr syncbuf.Buffer
	c, err := newCLI("stint", &stdout, &stderr, nil)
	if err != nil {
		return result{stderr: err.Error(), code: exitFailure}
	}
	defer c.builtins.close()
	mod(c)
	root := c.newRootCmd()
	root.SetIn(strings.NewReader(""))
	root.SetArgs(args)
	code := execute(ctx, "stint", root, &stderr)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// requireOK fails the test unless r exited with code 0.
func requireOK(t *testing.T, r result) {
	t.Helper()
	require.Equal(t, exitOK, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
}

// testContext returns a context that ends with the test or after timeout.
func testContext(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// startServer runs an in-process server node with every built-in behavior
// on the database at dsn until the test ends.
func startServer(t *testing.T, ctx context.Context, dsn, node string) *impl.Server {
	t.Helper()
	return startServerWith(t, ctx, dsn, node, nil)
}

// startServerWith is startServer with the program's behaviors (nil for
// none) besides the built-in ones.
func startServerWith(t *testing.T, ctx context.Context, dsn, node string, behaviors *spi.Registry) *impl.Server {
	t.Helper()
	st, err := postgres.Open(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	reg, err := (&builtins{log: log}).registry(st, behaviors)
	require.NoError(t, err)
	srv, err := impl.NewServer(st, impl.ServerConfig{
		Node:              node,
		Registry:          reg,
		PollInterval:      100 * time.Millisecond,
		AwaitPollInterval: 100 * time.Millisecond,
		Logger:            log,
	})
	require.NoError(t, err)
	require.NoError(t, srv.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, srv.Stop(stopCtx))
	})
	return srv
}

// countTasks returns the number of rows in stint_task.
func countTasks(t *testing.T, ctx context.Context, dsn string) int {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM stint_task`).Scan(&n))
	return n
}

// waitFor polls cond every 20 ms until it holds, failing the test after
// timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}

func TestRegistryHoldsBuiltInBehaviors(t *testing.T) {
	t.Parallel()
	c, err := newCLI("stint", io.Discard, io.Discard, nil)
	require.NoError(t, err)
	for _, id := range []api.BehaviorID{"demo.echo", "ingest.batch", "replication", "cleanup"} {
		_, ok := c.reg.Lookup(id)
		require.True(t, ok, id)
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	for _, args := range [][]string{
		{"nope"},
		{"tasks", "ls", "--bogus"},
		{"tasks", "show"},
		{"submit"},
		{"migrate", "status"}, // no --db and no STINT_DATABASE_URL in the test environment
		{"--log-level", "loud", "nodes", "ls"},
	} {
		if args[0] == "migrate" && os.Getenv(envDatabaseURL) != "" {
			continue
		}
		r := runCLI(ctx, args...)
		require.Equal(t, exitUsage, r.code, "args %q: stderr:\n%s", args, r.stderr)
		require.Contains(t, r.stderr, "stint: error: ", "args %q", args)
	}
}

// TestBadInputReadsWell runs the command line as a process named stint
// with bad input, as a user would type it: each is refused with exit code
// 2 and a message that names what is wrong, before any database is
// reached (the one given cannot be).
func TestBadInputReadsWell(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	require.NoError(t, err)
	stint := filepath.Join(t.TempDir(), "stint")
	require.NoError(t, os.Symlink(self, stint))
	const db = "postgres://nobody@127.0.0.1:1/none"
	for _, tc := range []struct {
		args []string
		want string // the whole of stderr
	}{
		{[]string{"migrate", "ls", "--db", db}, "stint: error: unknown command \"ls\" for \"stint migrate\" (its commands: down, status, up)\n" +
			"Run 'stint migrate --help' for usage.\n"},
		{[]string{"tasks", "lss", "--db", db}, "stint: error: unknown command \"lss\" for \"stint tasks\" " +
			"(its commands: fail, fork, hold, ls, release, retry, rewind, rm, show, wait); did you mean ls?\nRun 'stint tasks --help' for usage.\n"},
		{[]string{"limits", "set", "conc", "demo.echo", "--max", "3"}, "stint: error: unknown command \"conc\" for \"stint limits set\" " +
			"(its commands: concurrency, rate); did you mean concurrency?\nRun 'stint limits set --help' for usage.\n"},
		{[]string{"migrat", "up"}, "stint: error: unknown command \"migrat\" for \"stint\"; did you mean migrate?\nRun 'stint --help' for usage.\n"},
		{[]string{"submit"}, "stint: error: stint submit: missing BEHAVIOR\nRun 'stint submit --help' for usage.\n"},
		{[]string{"submit", "demo.echo", "extra"}, "stint: error: stint submit takes one argument, BEHAVIOR, not 2: \"demo.echo\" \"extra\"\n" +
			"Run 'stint submit --help' for usage.\n"},
		{[]string{"schedules", "add", "hourly"}, "stint: error: stint schedules add: missing BEHAVIOR\nRun 'stint schedules add --help' for usage.\n"},
		{[]string{"version", "now"}, "stint: error: stint version takes no arguments, got \"now\"\nRun 'stint version --help' for usage.\n"},
		{[]string{"--log-level", "loud", "version"}, "stint: error: invalid argument \"loud\" for \"--log-level\" flag: want debug, info, warn or error\n" +
			"Run 'stint version --help' for usage.\n"},
		{[]string{"limits", "set", "concurrency", "demo.echo", "--max", "-1", "--db", db},
			"stint: error: set concurrency limit of demo.echo: invalid max: -1 is negative\n"},
		{[]string{"limits", "set", "concurrency", "demo.echo", "--key", "acme", "--max", "1", "--weight", "-2", "--db", db},
			"stint: error: set concurrency limit of demo.echo key \"acme\": invalid weight: -2 is negative\n"},
		{[]string{"limits", "set", "rate", "partner-api", "--limit", "5", "--period", "9000h", "--db", db},
			"stint: error: set rate limit \"partner-api\": invalid period: must be from 1ms to 366 days, not 375 days\n"},
		{[]string{"limits", "set", "rate", "partner-api", "--limit", "5", "--period", "500us", "--db", db},
			"stint: error: set rate limit \"partner-api\": invalid period: must be from 1ms to 366 days, not 500µs\n"},
	} {
		stdout, stderr, code := RunProgram(t, stint, tc.args...)
		require.Equal(t, exitUsage, code, "%q: %s", tc.args, stderr)
		require.Equal(t, tc.want, stderr, "%q", tc.args)
		require.Empty(t, stdout, "%q", tc.args)
	}
}
