package cli

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
)

// TestEventsCommand: stint events lists a task's events, shows one, and
// waits for one; bad arguments exit 2, a wait that runs out exits 1.
func TestEventsCommand(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	requireOK(t, runCLI(ctx, "migrate", "up", "--db", dsn))
	requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"x"}`, "--id", "publisher", "--db", dsn))
	r := runCLI(ctx, "events", "publisher", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stderr, "task publisher has published no event")

	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	// As a run's statement sets it.
	_, err = conn.Exec(ctx, `INSERT INTO stint_event (task_id, key, value, at, created)
		SELECT id, 'progress', '{"pct": 50}', now(), created_at FROM stint_task WHERE id = 'publisher'`)
	require.NoError(t, err)

	r = runCLI(ctx, "events", "publisher", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `(?m)^progress\s+\S+.*\{"pct": 50\}$`, r.stdout)
	r = runCLI(ctx, "events", "publisher", "progress", "--json", "--wait", "5s", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, `"key": "progress"`)

	r = runCLI(ctx, "events", "publisher", "other", "--wait", "100ms", "--db", dsn)
	require.Equal(t, exitFailure, r.code, r.stderr)
	require.Contains(t, r.stderr, `task publisher did not set event "other" within 100ms`)
	for _, args := range [][]string{{"events"}, {"events", "publisher", "--wait", "1s"}, {"events", "a", "b", "c"}, {"events", "publisher", "bad key"}} {
		r = runCLI(ctx, append(args, "--db", dsn)...)
		require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
	}
}
