package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgcluster"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/syncbuf"
)

// devRun is `stint dev` running in-process.
type devRun struct {
	stdout, stderr *syncbuf.Buffer
	stop           context.CancelFunc
	done           chan int
}

// startDev starts `stint dev` on data directory dir.
func startDev(ctx context.Context, dir string) *devRun {
	ctx, stop := context.WithCancel(ctx)
	d := &devRun{stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, stop: stop, done: make(chan int, 1)}
	args := []string{"dev", "--data", dir, "--workers", "8"}
	go func() { d.done <- Run(ctx, args, nil, strings.NewReader(""), d.stdout, d.stderr) }()
	return d
}

var dsnLine = regexp.MustCompile(`(?m)^url: (\S+)$`)

// waitReady waits up to timeout until dev has printed its ready line and
// returns the DSN. A timeout shows what dev printed, which says how far it
// got.
func (d *devRun) waitReady(t *testing.T, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		select {
		case code := <-d.done:
			t.Fatalf("stint dev exited with %d before it was ready:\nstdout:\n%s\nstderr:\n%s", code, d.stdout, d.stderr)
		default:
		}
		out := d.stdout.String()
		if regexp.MustCompile(`(?m)^ready: `).MatchString(out) {
			m := dsnLine.FindStringSubmatch(out)
			require.NotNil(t, m, out)
			return m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("stint dev was not ready after %s:\nstdout:\n%s\nstderr:\n%s", timeout, out, d.stderr)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}

// shutdown cancels dev's context and checks that it exits cleanly.
func (d *devRun) shutdown(t *testing.T) {
	t.Helper()
	d.stop()
	select {
	case code := <-d.done:
		require.Equal(t, exitOK, code, "stderr:\n%s", d.stderr)
	case <-time.After(time.Minute):
		t.Fatalf("stint dev did not stop within a minute:\n%s", d.stderr)
	}
}

func TestDevRoundTripAndRestart(t *testing.T) {
	t.Parallel()
	// The first start makes a cluster with initdb, whose work is mostly
	// CPU: 3 s on an idle machine, 40 to 50 s beside busy cores (its
	// post-bootstrap step alone 25 s), and CI starts every test package's
	// clusters at once. A restart (no initdb) is ready in 2 to 5 s there.
	const firstStart, restart = 4 * time.Minute, time.Minute
	ctx := testContext(t, firstStart+restart+2*time.Minute)
	// PostgreSQL runs as an unprivileged user when the tests run as root:
	// the directory that holds pgdata must be searchable by that user.
	dir := pgtest.TempDir(t)
	require.NoError(t, os.Chmod(dir, 0o755))
	pgdata := filepath.Join(dir, "pgdata")

	dev := startDev(ctx, dir)
	t.Cleanup(dev.stop) // on failure: stops dev, which stops PostgreSQL
	dsn := dev.waitReady(t, firstStart)
	require.Contains(t, dev.stdout.String(), "  URL='"+dsn+"'\n")
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	tryLine := regexp.MustCompile(`(?m)^  (go run \S+ submit .*)$`).FindStringSubmatch(dev.stdout.String())
	require.NotNil(t, tryLine, dev.stdout.String())
	require.Contains(t, string(readme), "\n"+tryLine[1]+"\n", "dev suggests the README's command")

	r := runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"hi"}`, "--wait", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, `"text": "hi"`)

	// dev's own demo task makes its round trip too, and the demo batch is
	// submitted.
	roundTrip := regexp.MustCompile(`round trip done.*result="hello from stint dev"`)
	waitFor(t, 30*time.Second, "the demo round trip", func() bool { return roundTrip.MatchString(dev.stderr.String()) })
	waitFor(t, 30*time.Second, "the demo batch", func() bool {
		return strings.Contains(dev.stderr.String(), "submitted a demo ingest batch")
	})
	// The dashboard's link holds a token dev keeps, readable by its user
	// alone.
	link := dashboardLine.FindString(dev.stdout.String())
	require.NotEmpty(t, link, dev.stdout.String())
	info, err := os.Stat(filepath.Join(dir, "token"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	token, err := os.ReadFile(filepath.Join(dir, "token"))
	require.NoError(t, err)
	require.Contains(t, link, "#token="+strings.TrimSpace(string(token)))

	dev.shutdown(t)
	require.False(t, pgcluster.Running(pgdata), "dev should stop the PostgreSQL it started")
	require.Contains(t, dev.stderr.String(), "server stopped")

	// A second run keeps the data and, the ports being free, the DSN and
	// the dashboard's link; it runs the demo task again and leaves the
	// demo batch as it is: neither adds a task.
	dev2 := startDev(ctx, dir)
	t.Cleanup(dev2.stop)
	require.Equal(t, dsn, dev2.waitReady(t, restart))
	require.Equal(t, link, dashboardLine.FindString(dev2.stdout.String()), "the link stays good")
	waitFor(t, 30*time.Second, "the demo round trip", func() bool { return roundTrip.MatchString(dev2.stderr.String()) })
	waitFor(t, 30*time.Second, "the demo batch to be found", func() bool {
		return strings.Contains(dev2.stderr.String(), "the demo batch of an earlier run is there")
	})
	r = runCLI(ctx, "tasks", "ls", "--status", "success", "--json", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `"text": "hi"`, r.stdout, "the first run's task should still be there")
	for behavior, want := range map[string]int{"demo.echo": 2, "ingest.batch": 1} {
		r = runCLI(ctx, "tasks", "ls", "--behavior", behavior, "--json", "--db", dsn)
		requireOK(t, r)
		var page api.Page
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
		require.Len(t, page.Tasks, want, "%s: %s", behavior, r.stdout)
	}
	dev2.shutdown(t)
	require.False(t, pgcluster.Running(pgdata))
}

// dashboardLine matches the dashboard's link that dev prints.
var dashboardLine = regexp.MustCompile(`(?m)^dashboard: \S+$`)

// TestDevWithoutPostgres runs dev where no PostgreSQL can be found or
// installed.
func TestDevWithoutPostgres(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	noPostgres := func(c *cli) {
		c.postgresBinDir = func(context.Context) (string, error) {
			return "", fmt.Errorf("%w: install the PostgreSQL server (Debian/Ubuntu: `apt-get install postgresql`)", pgcluster.ErrNoPostgres)
		}
	}
	dir := t.TempDir()
	r := runCLIWith(ctx, noPostgres, "dev", "--data", filepath.Join(dir, "data"))
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "stint: error: PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: install the PostgreSQL server")
	require.NoDirExists(t, filepath.Join(dir, "data"), "nothing is created without PostgreSQL")
}

func TestDevBadFlags(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	r := runCLI(ctx, "dev", "--port", "70000")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "--port 70000 is outside 0..65535")
	r = runCLI(ctx, "dev", "--db", "postgres://x")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "unknown flag: --db")
}
