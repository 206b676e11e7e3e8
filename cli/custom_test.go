package cli_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/cli"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/syncbuf"
	"github.com/stinthq/stint/spi"
)

// greetParams are the params of demo.greet, a behavior of the test's own.
type greetParams struct {
	Name string `json:"name" validate:"required"`
}

// greetResult is the result of demo.greet.
type greetResult struct {
	Greeting string `json:"greeting"`
}

// greet is demo.greet: it greets by name.
type greet struct{}

func (greet) Kind() api.Kind[greetParams, greetResult] {
	return api.Kind[greetParams, greetResult]{ID: "demo.greet"}
}

func (greet) TaskID(ids spi.IDs, _ greetParams) api.TaskID { return ids.Unique() }

func (greet) Run(_ context.Context, _ spi.RunContext, p greetParams) (greetResult, error) {
	return greetResult{Greeting: "hello, " + p.Name}, nil
}

// run runs the command line of a program with the behaviors of reg.
func run(ctx context.Context, reg *spi.Registry, args ...string) (stdout, stderr string, code int) {
	var out, errOut syncbuf.Buffer
	code = cli.Run(ctx, args, reg, strings.NewReader(""), &out, &errOut)
	return out.String(), errOut.String(), code
}

// TestProgramWithItsOwnBehavior runs the stint commands of a program that
// registers demo.greet: its server runs it and its submit awaits it, while
// the stint command, without it, refuses it.
func TestProgramWithItsOwnBehavior(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn := pgtest.New(t)
	reg := spi.NewRegistry()
	spi.MustRegister(reg, spi.Behavior[greetParams, greetResult](greet{}))

	_, stderr, code := run(ctx, nil, "submit", "demo.greet", "--params", `{"name":"Ada"}`, "--db", dsn)
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `"demo.greet" is not registered`)

	srvCtx, stop := context.WithCancel(ctx)
	defer stop()
	type result struct {
		stderr string
		code   int
	}
	done := make(chan result, 1)
	var srvOut, srvErr syncbuf.Buffer
	go func() {
		args := []string{"server", "--db", dsn, "--behaviors", "demo.greet", "--http", "127.0.0.1:0", "--insecure-no-auth"}
		code := cli.Run(srvCtx, args, reg, strings.NewReader(""), &srvOut, &srvErr)
		done <- result{srvErr.String(), code}
	}()

	stdout, stderr, code := run(ctx, reg, "submit", "demo.greet", "--params", `{"name":"Ada"}`, "--wait", "--db", dsn)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, ": success (attempt 1")
	require.Contains(t, stdout, `"greeting": "hello, Ada"`)

	_, stderr, code = run(ctx, reg, "submit", "demo.greet", "--params", `{}`, "--db", dsn)
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "name")

	// The server's HTTP API (the dashboard's) knows the behavior too.
	dashboard := regexp.MustCompile(`dashboard: (http://\S+)/`)
	for deadline := time.Now().Add(time.Minute); !dashboard.MatchString(srvOut.String()); {
		require.True(t, time.Now().Before(deadline), "the HTTP server did not start: %s", srvErr.String())
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
	base := dashboard.FindStringSubmatch(srvOut.String())[1]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/tasks",
		strings.NewReader(`{"behavior":"demo.greet","params":{"name":"Bob"}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, string(body))

	stop()
	select {
	case r := <-done:
		require.Equal(t, 0, r.code, r.stderr)
	case <-ctx.Done():
		t.Fatal("the server did not stop")
	}
}

// flaky is demo.flaky: every run fails, retryably, and the next try is an
// hour away, so that the task stays retrying.
type flaky struct{ greet }

func (flaky) Kind() api.Kind[greetParams, greetResult] {
	return api.Kind[greetParams, greetResult]{ID: "demo.flaky"}
}

func (flaky) Policy() spi.Policy {
	return spi.Policy{MaxAttempts: 3, BackoffMin: time.Hour, BackoffMax: time.Hour}
}

func (flaky) Run(context.Context, spi.RunContext, greetParams) (greetResult, error) {
	return greetResult{}, &api.TaskError{Retryable: true, Code: "unreachable", Message: "the greeter is unreachable"}
}

// TestRetryingTaskIsShownWithItsError: a task that failed and runs again
// shows as retrying with its attempt, next time and error, not as a failure.
func TestRetryingTaskIsShownWithItsError(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn := pgtest.New(t)
	reg := spi.NewRegistry()
	spi.MustRegister(reg, spi.Behavior[greetParams, greetResult](flaky{}))
	srvCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan int, 1)
	go func() {
		_, _, code := run(srvCtx, reg, "server", "--db", dsn, "--behaviors", "demo.flaky")
		done <- code
	}()

	_, stderr, code := run(ctx, reg, "submit", "demo.flaky", "--params", `{"name":"Ada"}`, "--id", "flaky-1", "--db", dsn)
	require.Equal(t, 0, code, stderr)
	var task api.Task
	for deadline := time.Now().Add(time.Minute); !task.Retrying(); {
		require.True(t, time.Now().Before(deadline), "the task did not fail its first run: %+v", task)
		stdout, stderr, code := run(ctx, reg, "tasks", "show", "flaky-1", "--json", "--db", dsn)
		require.Equal(t, 0, code, stderr)
		require.NoError(t, json.Unmarshal([]byte(stdout), &task))
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
	stdout, stderr, code := run(ctx, reg, "tasks", "show", "flaky-1", "--db", dsn)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^status:\s+retrying \(attempt 1 of 3, next at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\): unreachable: the greeter is unreachable$`, stdout)
	stdout, stderr, code = run(ctx, reg, "tasks", "ls", "--db", dsn)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^flaky-1\s+demo\.flaky\s+retrying\s`, stdout)

	stop()
	require.Equal(t, 0, <-done)
}

// TestProgramBehaviorClashingWithABuiltIn fails at start, naming the id.
func TestProgramBehaviorClashingWithABuiltIn(t *testing.T) {
	t.Parallel()
	reg := spi.NewRegistry()
	require.NoError(t, spi.Register(reg, spi.Behavior[greetParams, greetResult](clash{})))
	_, stderr, code := run(context.Background(), reg, "submit", "--help")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "demo.echo: already registered")
}

// clash is a behavior with the id of the built-in demo.echo.
type clash struct{ greet }

func (clash) Kind() api.Kind[greetParams, greetResult] {
	return api.Kind[greetParams, greetResult]{ID: "demo.echo"}
}

// TestProgramNamesItself runs this test binary as a program of one's own
// calling cli.Main, under the name acme (a link to it): its help, its
// commands' examples, its usage errors and its error messages name acme,
// and no command line in them names stint.
func TestProgramNamesItself(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	require.NoError(t, err)
	acme := filepath.Join(t.TempDir(), "acme")
	require.NoError(t, os.Symlink(self, acme))
	run := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		return cli.RunProgram(t, acme, args...)
	}
	stintCommandLine := regexp.MustCompile(`(^|[\s'"])stint (dev|server|migrate|submit|tasks|nodes|schedules|stats|ingest|batches|replications)\b`)

	out, _, code := run("--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "acme runs durable tasks on PostgreSQL")
	require.Contains(t, out, "Start with 'acme dev'")
	require.Contains(t, out, "acme [command]")
	require.NotRegexp(t, stintCommandLine, out)
	for _, sub := range [][]string{{"submit"}, {"tasks", "ls"}, {"server"}, {"schedules", "add"}, {"ingest", "submit"}} {
		out, _, code := run(append(sub, "--help")...)
		require.Equal(t, 0, code, "%v", sub)
		require.Contains(t, out, "acme "+strings.Join(sub, " ")+" ", "%v", sub)
		require.NotRegexp(t, stintCommandLine, out, "%v", sub)
	}

	_, errOut, code := run("bogus")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `acme: error: unknown command "bogus" for "acme"`)
	require.Contains(t, errOut, "Run 'acme --help' for usage.")
	_, errOut, code = run("tasks", "show", "x", "--limit", "3")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "acme: error: unknown flag: --limit")
	require.Contains(t, errOut, "Run 'acme tasks show --help' for usage.")
	_, errOut, code = run("tasks", "show", "some-task")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "acme: error: no database: pass --db")
	require.NotContains(t, errOut, "stint:")
}
