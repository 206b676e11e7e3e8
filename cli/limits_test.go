package cli

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
)

// limitedParams are the params of test.limited.
type limitedParams struct {
	Customer string `json:"customer"`
}

// limited is test.limited: its tasks succeed at once, each after taking one
// unit of the rate limit test-api under the key of its customer.
type limited struct{}

var limitedKind = api.Kind[limitedParams, struct{}]{ID: "test.limited"}

func (limited) Kind() api.Kind[limitedParams, struct{}] { return limitedKind }

func (limited) TaskID(ids spi.IDs, _ limitedParams) api.TaskID { return ids.Unique() }

func (limited) Run(context.Context, spi.RunContext, limitedParams) (struct{}, error) {
	return struct{}{}, nil
}

func (limited) RateUses(p limitedParams) []spi.RateUse {
	return []spi.RateUse{{Limit: "test-api", Key: p.Customer}}
}

func TestLimitsSetLsRm(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 3*time.Minute)
	dsn := pgtest.New(t)
	reg := spi.NewRegistry()
	require.NoError(t, spi.Register(reg, spi.Behavior[limitedParams, struct{}](limited{})))
	srv := startServerWith(t, ctx, dsn, "node-limits", reg)

	r := runCLI(ctx, "limits", "ls", "--db", dsn)
	requireOK(t, r)
	require.Empty(t, r.stdout)
	require.Equal(t, "no rate limits\nno concurrency limits\n", r.stderr)

	r = runCLI(ctx, "limits", "set", "rate", "test-api", "--limit", "2", "--period", "1h", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "rate limit test-api set: 2 per 1h\n", r.stdout)
	r = runCLI(ctx, "limits", "set", "concurrency", "demo.echo", "--max", "1", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "concurrency limit of demo.echo set: at most 1 running\n", r.stdout)
	r = runCLI(ctx, "limits", "set", "concurrency", "demo.echo", "--key", "acme", "--max", "0", "--weight", "3", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "concurrency limit of demo.echo key \"acme\" set: the policy's cap, weight 3\n", r.stdout)

	// Bad input: exit code 2, a message naming what is wrong, nothing
	// stored.
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"set", "rate", "x", "--period", "1m"}, "--limit is required"},
		{[]string{"set", "rate", "x", "--limit", "1"}, "--period is required"},
		{[]string{"set", "rate", "x", "--limit", "0", "--period", "1m"}, "limit"},
		{[]string{"set", "rate", "x", "--limit", "-1", "--period", "1m"}, "limit"},
		{[]string{"set", "rate", "x", "--limit", "1", "--period", "0s"}, "period"},
		{[]string{"set", "rate", "x", "--limit", "1", "--period", "-1s"}, "period"},
		{[]string{"set", "rate", "x", "--limit", "1", "--period", "soon"}, `invalid argument "soon" for "--period"`},
		{[]string{"set", "rate", "x", "--limit", "many", "--period", "1m"}, `invalid argument "many" for "--limit"`},
		{[]string{"set", "rate", strings.Repeat("n", 129), "--limit", "1", "--period", "1m"}, "name"},
		{[]string{"set", "rate", "--limit", "1", "--period", "1m"}, "stint limits set rate: missing NAME"},
		{[]string{"set", "concurrency", "demo.echo"}, "--max is required"},
		{[]string{"set", "concurrency", "demo.echo", "--max", "0"}, "max"},
		{[]string{"set", "concurrency", "demo.echo", "--max", "-1"}, "max"},
		{[]string{"set", "concurrency", "demo.echo", "--max", "1", "--weight", "2"}, "weight"},
		{[]string{"set", "concurrency", "demo.echo", "--key", "acme", "--max", "1", "--weight", "-1"}, "weight"},
		{[]string{"set", "concurrency", "demo.echo", "--key", strings.Repeat("k", 257), "--max", "1"}, "key"},
		{[]string{"set", "concurrency", "Not A Behavior", "--max", "1"}, "behavior"},
		{[]string{"rm", "rate"}, "stint limits rm rate: missing NAME"},
	} {
		r := runCLI(ctx, append(append([]string{"limits"}, bad.args...), "--db", dsn)...)
		require.Equal(t, exitUsage, r.code, "%v: %s", bad.args, r.stderr)
		require.Contains(t, r.stderr, bad.want, bad.args)
	}
	var listed struct {
		Rate        []api.RateLimitInfo   `json:"rate"`
		Concurrency []api.ConcurrencyInfo `json:"concurrency"`
	}
	r = runCLI(ctx, "limits", "ls", "--json", "--db", dsn)
	requireOK(t, r)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &listed))
	require.Len(t, listed.Rate, 1, "refused limits stored nothing")
	require.Equal(t, api.RateLimit{Name: "test-api", Limit: 2, Period: time.Hour}, listed.Rate[0].RateLimit)
	require.Len(t, listed.Concurrency, 2)

	// Two of acme's three tasks start; the third waits for the budget.
	var ids []api.TaskID
	for range 3 {
		f, err := api.Submit(ctx, srv, limitedKind, limitedParams{Customer: "acme"})
		require.NoError(t, err)
		ids = append(ids, f.ID())
	}
	var waiting api.TaskID
	waitFor(t, time.Minute, "two tasks done and one waiting", func() bool {
		done, wait := 0, 0
		for _, id := range ids {
			task, err := srv.Get(ctx, id)
			require.NoError(t, err)
			switch {
			case task.Status == api.StatusSuccess:
				done++
			case task.Waiting != nil:
				wait++
				waiting = id
			}
		}
		return done == 2 && wait == 1
	})
	r = runCLI(ctx, "limits", "ls", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `(?m)^RATE LIMIT\s+LIMIT\s+PERIOD\s+KEY\s+USED\s+WAITING\s+NEXT FREE$`, r.stdout)
	require.Regexp(t, `(?m)^test-api\s+2\s+1h\s+acme\s+2\s+1\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`, r.stdout)
	require.Regexp(t, `(?m)^CONCURRENCY\s+KEY\s+MAX\s+WEIGHT\s+RUNNING\s+WAITING$`, r.stdout)
	require.Regexp(t, `(?m)^demo\.echo\s+-\s+1\s+-\s+0\s+0$`, r.stdout)
	require.Regexp(t, `(?m)^demo\.echo\s+acme\s+policy\s+3\s+0\s+0$`, r.stdout)

	r = runCLI(ctx, "tasks", "show", string(waiting), "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, regexp.MustCompile(`(?m)^status:\s+scheduled, waiting on rate limit test-api \(key acme\) until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`), r.stdout)
	r = runCLI(ctx, "tasks", "ls", "--behavior", "test.limited", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `(?m)^`+regexp.QuoteMeta(string(waiting))+`\s+test\.limited\s+waiting \(rate limit test-api\)\s`, r.stdout)

	// A cap of one running demo.echo: a second waits on it.
	blocker, err := api.Submit(ctx, srv, demo.Echo, demo.EchoParams{Text: "hold the slot", DelayMS: 60000})
	require.NoError(t, err)
	waitFor(t, time.Minute, "the blocker to run", func() bool {
		task, err := srv.Get(ctx, blocker.ID())
		require.NoError(t, err)
		return task.Status == api.StatusRunning
	})
	second, err := api.Submit(ctx, srv, demo.Echo, demo.EchoParams{Text: "wait"})
	require.NoError(t, err)
	waitFor(t, time.Minute, "the second to wait on the cap", func() bool {
		task, err := srv.Get(ctx, second.ID())
		require.NoError(t, err)
		return task.Waiting != nil
	})
	r = runCLI(ctx, "tasks", "show", string(second.ID()), "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, regexp.MustCompile(`(?m)^status:\s+scheduled, waiting on the concurrency cap of demo\.echo$`), r.stdout)
	r = runCLI(ctx, "limits", "ls", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `(?m)^demo\.echo\s+-\s+1\s+-\s+1\s+1$`, r.stdout)

	// Removing.
	r = runCLI(ctx, "limits", "rm", "rate", "test-api", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "rate limit test-api removed\n", r.stdout)
	r = runCLI(ctx, "limits", "rm", "rate", "test-api", "--db", dsn)
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "no such rate limit")
	r = runCLI(ctx, "limits", "rm", "concurrency", "demo.echo", "--key", "nobody", "--db", dsn)
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "no such concurrency limit")
	requireOK(t, runCLI(ctx, "limits", "rm", "concurrency", "demo.echo", "--key", "acme", "--db", dsn))
	r = runCLI(ctx, "limits", "rm", "concurrency", "demo.echo", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "concurrency limit of demo.echo removed\n", r.stdout)
	_, err = second.Await(ctx)
	require.NoError(t, err, "with the cap gone the second runs")
	require.NoError(t, srv.Remove(ctx, blocker.ID()), "halt the blocker rather than wait for it at the server's stop")
	r = runCLI(ctx, "limits", "ls", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "no rate limits\nno concurrency limits\n", r.stderr)
}

// TestLimitsRefuseAnUnknownBehavior: a cap of a behavior that this program
// does not register and no live node runs is refused (exit 2, naming it
// and which nodes run what, nothing stored) unless --force says its nodes
// are not deployed yet. A behavior a live node runs is known, and one
// only a dead node ran is not.
func TestLimitsRefuseAnUnknownBehavior(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	reg := spi.NewRegistry()
	require.NoError(t, spi.Register(reg, spi.Behavior[limitedParams, struct{}](limited{})))
	startServerWith(t, ctx, dsn, "node-known", reg)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, `INSERT INTO stint_node (id, host, pid, behaviors, max_workers, heartbeat_at)
		VALUES ('node-dead', 'h', 1, '{gone.kind}', 1, now() - interval '10 minutes')`)
	require.NoError(t, err)

	for _, behavior := range []string{"nope.kind", "gone.kind"} {
		r := runCLI(ctx, "limits", "set", "concurrency", behavior, "--max", "3", "--db", dsn)
		require.Equal(t, exitUsage, r.code, r.stderr)
		require.Contains(t, r.stderr, `stint: error: set concurrency limit of `+behavior+`: invalid behavior: "`+behavior+
			`" is not registered here and no live node runs it (node-known runs `)
		require.Contains(t, r.stderr, "test.limited")
		require.Contains(t, r.stderr, "; pass --force to set it for a behavior whose nodes are not deployed yet\n")
	}
	r := runCLI(ctx, "limits", "ls", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stderr, "no concurrency limits", "refused caps stored nothing")

	requireOK(t, runCLI(ctx, "limits", "set", "concurrency", "test.limited", "--max", "3", "--db", dsn))
	r = runCLI(ctx, "limits", "set", "concurrency", "nope.kind", "--max", "3", "--force", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "concurrency limit of nope.kind set: at most 3 running\n", r.stdout)
	r = runCLI(ctx, "limits", "ls", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `(?m)^nope\.kind\s+-\s+3\s`, r.stdout)
	require.Regexp(t, `(?m)^test\.limited\s+-\s+3\s`, r.stdout)
}
