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

func TestSchedulesAddLsRm(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)

	r := runCLI(ctx, "schedules", "add", "hourly-echo", "demo.echo", "--spec", "@hourly", "--zone", "Europe/Berlin",
		"--params", `{"text":"tick"}`, "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "schedule hourly-echo added\n", r.stdout)

	r = runCLI(ctx, "schedules", "ls", "--db", dsn)
	requireOK(t, r)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 2, r.stdout)
	require.Regexp(t, `^NAME\s+BEHAVIOR\s+SPEC\s+ZONE\s+ORIGIN\s+LAST TICK\s+NEXT TICK$`, lines[0])
	require.Regexp(t, `^hourly-echo\s+demo\.echo\s+@hourly\s+Europe/Berlin\s+added\s+-\s+\d{4}-\d\d-\d\d \d\d:00:00$`, lines[1])

	r = runCLI(ctx, "schedules", "ls", "--json", "--db", dsn)
	requireOK(t, r)
	var out struct{ Schedules []api.ScheduleInfo }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	require.Len(t, out.Schedules, 1)
	require.True(t, out.Schedules[0].NextTick.After(time.Now().Add(-time.Minute)))
	require.JSONEq(t, `{"text":"tick"}`, string(out.Schedules[0].Params))

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"schedules", "add", "x", "demo.echo"}, "--spec is required"},
		{[]string{"schedules", "add", "x", "demo.echo", "--spec", "every hour"}, "spec"},
		{[]string{"schedules", "add", "x", "demo.echo", "--spec", "@daily", "--zone", "Mars/Olympus"}, "time zone"},
		{[]string{"schedules", "add", "Bad Name", "demo.echo", "--spec", "@daily"}, "name"},
		{[]string{"schedules", "add", "x", "no.such", "--spec", "@daily"}, "not registered"},
		{[]string{"schedules", "add", "x", "demo.echo", "--spec", "@daily", "--params", `{"text":`}, "params"},
		{[]string{"schedules", "add", "x"}, "stint schedules add: missing BEHAVIOR"},
	} {
		r := runCLI(ctx, append(bad.args, "--db", dsn)...)
		require.Equal(t, exitUsage, r.code, "%v: %s", bad.args, r.stderr)
		require.Contains(t, r.stderr, bad.want, bad.args)
	}
	r = runCLI(ctx, "schedules", "ls", "--json", "--db", dsn)
	requireOK(t, r)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	require.Len(t, out.Schedules, 1, "refused schedules stored nothing")

	requireOK(t, runCLI(ctx, "schedules", "rm", "hourly-echo", "--db", dsn))
	r = runCLI(ctx, "schedules", "rm", "hourly-echo", "--db", dsn)
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "no such schedule")
	r = runCLI(ctx, "schedules", "ls", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stderr, "no schedules")
}
