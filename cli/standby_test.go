package cli

import (
	"encoding/json"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
)

// listIDs runs `stint tasks ls --json` with args and returns the ids.
func listIDs(t *testing.T, r result) []api.TaskID {
	t.Helper()
	requireOK(t, r)
	var page api.Page
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
	ids := []api.TaskID{}
	for _, task := range page.Tasks {
		ids = append(ids, task.ID)
	}
	return ids
}

// With --read-db (or $STINT_READ_DATABASE_URL) the read commands read the
// standby, which, paused, shows the old state; show still finds a task
// only the primary has, and submit --wait still returns.
func TestReadDBServesReadCommandsFromTheStandby(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	primary, standby, _ := pgtest.NewStandby(t)
	requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"old"}`, "--id", "task-old", "--db", primary))
	pgtest.CatchUp(t, primary, standby)
	pgtest.PauseReplay(t, standby)
	requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"new"}`, "--id", "task-new", "--db", primary))

	require.Equal(t, []api.TaskID{"task-old"}, listIDs(t, runCLI(ctx, "tasks", "ls", "--json", "--db", primary, "--read-db", standby)))
	require.Equal(t, []api.TaskID{"task-new", "task-old"}, listIDs(t, runCLI(ctx, "tasks", "ls", "--json", "--db", primary)))
	t.Setenv(envReadDatabaseURL, standby)
	require.Equal(t, []api.TaskID{"task-old"}, listIDs(t, runCLI(ctx, "tasks", "ls", "--json", "--db", primary)),
		"--read-db defaults to $"+envReadDatabaseURL)

	r := runCLI(ctx, "tasks", "show", "task-new", "--json", "--db", primary, "--read-db", standby)
	requireOK(t, r)
	var task api.Task
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &task))
	require.Equal(t, api.TaskID("task-new"), task.ID)

	r = runCLI(ctx, "stats", "--json", "--db", primary, "--read-db", standby)
	requireOK(t, r)
	var stats struct {
		Counts []struct {
			Count int64 `json:"count"`
		} `json:"counts"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &stats), r.stdout)
	var total int64
	for _, c := range stats.Counts {
		total += c.Count
	}
	require.Equal(t, int64(1), total, "stats reads the paused standby: %s", r.stdout)

	startServer(t, ctx, primary, "node-standby")
	r = runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"awaited"}`, "--wait", "--db", primary, "--read-db", standby)
	requireOK(t, r)
	require.Contains(t, r.stdout, "success (attempt 1 on node-standby)")
}

// A malformed --read-db is a usage error, and one nothing answers a
// failure; neither changes anything.
func TestReadDBBadURL(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "postgres://postgres@127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port) + "/x?sslmode=disable&connect_timeout=5"
	require.NoError(t, l.Close())
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"tasks", "ls", "--read-db", "postgres://u@h:notaport/db"}, exitUsage, "--read-db:"},
		{[]string{"stats", "--read-db", "postgres://u@h:notaport/db"}, exitUsage, "--read-db:"},
		{[]string{"submit", "demo.echo", "--params", `{"text":"x"}`, "--wait", "--read-db", "postgres://u@h:notaport/db"}, exitUsage, "--read-db:"},
		{[]string{"tasks", "ls", "--read-db", closed}, exitFailure, "read database: connect"},
		{[]string{"nodes", "ls", "--read-db", closed}, exitUsage, "unknown flag: --read-db"},
	} {
		r := runCLI(ctx, append(tc.args, "--db", dsn)...)
		require.Equal(t, tc.code, r.code, "args %q: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, "args %q", tc.args)
	}
	require.Zero(t, countTasks(t, ctx, dsn))
}
