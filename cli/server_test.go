package cli

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/behaviors/ingest"
	"github.com/stinthq/stint/internal/buildinfo"
	"github.com/stinthq/stint/internal/pgtest"
)

func TestServerCommandRunsTasksAndStopsCleanly(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)

	srvCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan result, 1)
	go func() {
		done <- runCLI(srvCtx, "server", "--db", dsn, "--node", "cli-node", "--workers", "4", "--behaviors", "demo.echo")
	}()

	var nodes []nodeJSON
	waitFor(t, 30*time.Second, "the node to register", func() bool {
		r := runCLI(ctx, "nodes", "ls", "--json", "--db", dsn)
		requireOK(t, r)
		var page struct{ Nodes []nodeJSON }
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
		nodes = page.Nodes
		return len(nodes) == 1
	})
	require.Equal(t, "cli-node", nodes[0].ID)
	require.Equal(t, 4, nodes[0].MaxWorkers)
	require.GreaterOrEqual(t, nodes[0].HeartbeatAgeMS, int64(0))

	r := runCLI(ctx, "nodes", "ls", "--db", dsn)
	requireOK(t, r)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 2, r.stdout)
	require.Regexp(t, `^ID\s+VERSION\s+HOST\s+PID\s+WORKERS\s+BEHAVIORS\s+STARTED\s+HEARTBEAT AGE\s+DATABASE$`, lines[0])
	require.Regexp(t, `^cli-node\s+`+regexp.QuoteMeta(buildinfo.Read().String())+`\s+\S+\s+\d+\s+4\s+demo\.echo,stint\.workflow,stint\.gate,stint\.subworkflow\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+[0-9.]+m?s\s+ok$`, lines[1])

	r = runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"via server"}`, "--wait", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "success (attempt 1 on cli-node)")

	stop()
	select {
	case r := <-done:
		requireOK(t, r)
		require.Contains(t, r.stderr, "server stopped")
	case <-ctx.Done():
		t.Fatal("the server did not stop")
	}
	r = runCLI(ctx, "nodes", "ls", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stderr, "no nodes registered")
}

func TestServerBadFlags(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--behaviors", "demo.echo,demo.nope"}, `--behaviors: unknown behavior "demo.nope"; known behaviors: cleanup, demo.echo,`},
		{[]string{"--workers", "-1"}, "--workers -1 is negative"},
		{[]string{"--db", "not a url"}, "--db:"},
	} {
		args := append([]string{"server"}, tc.args...)
		if !strings.Contains(strings.Join(tc.args, " "), "--db") {
			args = append(args, "--db", "postgres://nobody@127.0.0.1:1/none")
		}
		r := runCLI(ctx, args...)
		require.Equal(t, exitUsage, r.code, "args %q: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want)
	}
}

// TestServerBadIngestSettings: a bad ingest setting in the environment
// fails the server's start with an error naming the variable; good ones
// configure the ingest behaviors. Not parallel: it sets the environment.
func TestServerBadIngestSettings(t *testing.T) {
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	for _, tc := range []struct{ env, value, want string }{
		{envIngestSMTP, "mail.example.org:25", "$STINT_INGEST_SMTP: smtp URL: want smtp://"},
		{envIngestSMTP, "smtp://mail.example.org:25", `$STINT_INGEST_SMTP: smtp URL: smtp sender ""`},
		{envIngestSMTP, "smtp://mail.example.org:0?from=q@example.org", "port"},
		{envIngestLargeBytes, "lots", `$STINT_INGEST_LARGE_JOB_BYTES: "lots" is not a number of bytes`},
		{envIngestLargePriority, "40000", `$STINT_INGEST_LARGE_JOB_PRIORITY: "40000" is not a priority from 0 to 32767`},
	} {
		t.Run(tc.env+"="+tc.value, func(t *testing.T) {
			t.Setenv(tc.env, tc.value)
			r := runCLI(ctx, "server", "--db", dsn, "--node", "bad-settings")
			require.NotEqual(t, 0, r.code, r.stderr)
			require.Contains(t, r.stderr, tc.want)
		})
	}

	t.Setenv(envIngestSMTP, "smtp://mail.example.org:587?from=queue@example.org")
	t.Setenv(envIngestLargeBytes, "-1")
	t.Setenv(envIngestLargePriority, "20")
	var cfg ingest.Config
	require.NoError(t, readIngestSettings(&cfg))
	require.NotNil(t, cfg.Notifier)
	require.EqualValues(t, -1, cfg.LargeJobBytes)
	require.Equal(t, 20, cfg.LargeJobPriority)
}
