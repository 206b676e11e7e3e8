package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/internal/pgtest"
)

func TestMain(m *testing.M) {
	// The scale scenario re-executes the test binary as a node.
	if os.Getenv(envNode) != "" && len(os.Args) > 1 && os.Args[1] == nodeCommand {
		os.Exit(nodeMain(os.Args[2:]))
	}
	if os.Getenv(envNode) != "" && len(os.Args) > 1 && os.Args[1] == clientCommand {
		os.Exit(clientMain(os.Args[2:]))
	}
	pgtest.Main(m)
}

// TestScenarios runs every scenario of every system at a tiny size and
// checks that the counts add up.
func TestScenarios(t *testing.T) {
	cfg := defaultConfig()
	cfg.burndown, cfg.streaming, cfg.burst, cfg.drainBurst, cfg.latency, cfg.scale, cfg.floor = true, true, true, true, true, true, true
	const n = 500
	cfg.n, cfg.scaleN, cfg.floorN, cfg.burstN = n, n, n, n
	cfg.burstBatch, cfg.drainCycles = 200, 2
	cfg.batch = 200 // several insert statements
	cfg.floorClaim = 100
	cfg.streamDur, cfg.streamWarmup = time.Second, 0
	cfg.streamBatch, cfg.streamBacklog = 100, 500
	cfg.latRate, cfg.latDur = 50, time.Second
	cfg.scaleNodes = []int{1, 2}
	cfg.concurrent, cfg.concurrentN = true, 200
	cfg.timeout = time.Minute
	cfg.runs = 1

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := newTestBench(t, cfg).run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Error != "" {
			t.Errorf("%s %s: %s", r.Scenario, r.System, r.Error)
		}
	}

	find := func(scenario, metric, system string, nodes int) Result {
		t.Helper()
		for _, r := range rep.Results {
			if r.Scenario == scenario && r.Metric == metric && r.System == system && r.Nodes == nodes {
				return r
			}
		}
		t.Fatalf("no result for %s %s %s %d", scenario, metric, system, nodes)
		return Result{}
	}
	for _, sys := range []string{sysStint, sysRiver, sysFloor} {
		for _, metric := range []string{"insert", "work"} {
			r := find("burn-down", metric, sys, 0)
			if r.Tasks != n || r.PerSec <= 0 {
				t.Errorf("burn-down %s %s: %d tasks at %.0f/s, want %d at > 0", metric, sys, r.Tasks, r.PerSec, n)
			}
			if sys != sysStint && r.StintRatio <= 0 {
				t.Errorf("burn-down %s %s: no stint ratio", metric, sys)
			}
		}
	}
	for _, sys := range []string{sysStint, sysRiver} {
		for _, scenario := range []string{"streaming", scenarioStreamingClient} {
			if r := find(scenario, "work", sys, 0); r.Tasks <= 0 || r.PerSec <= 0 {
				t.Errorf("%s %s: %d tasks at %.0f/s, want some", scenario, sys, r.Tasks, r.PerSec)
			}
		}
		if r := find("burst", "work", sys, 0); r.Tasks != n || r.PerSec <= 0 {
			t.Errorf("burst %s: %d tasks at %.0f/s, want %d at > 0", sys, r.Tasks, r.PerSec, n)
		}
		if r := find("drain-burst", "work", sys, 0); r.Tasks != 2*n || r.PerSec <= 0 {
			t.Errorf("drain-burst %s: %d tasks at %.0f/s, want %d at > 0", sys, r.Tasks, r.PerSec, 2*n)
		}
		for _, k := range cfg.scaleNodes {
			if r := find("scale", "work", sys, k); r.Tasks != n || r.PerSec <= 0 {
				t.Errorf("scale %d %s: %d tasks at %.0f/s, want %d at > 0", k, sys, r.Tasks, r.PerSec, n)
			}
		}
	}
	for _, metric := range []string{metricConcurrentCli, metricConcurrentSelf} {
		for _, sys := range []string{sysStint, sysRiver} {
			if r := find(scenarioConcurrent, metric, sys, 0); r.Tasks != int64(cfg.concurrentN) || r.PerSec <= 0 || (sys != sysStint && r.StintRatio <= 0) {
				t.Errorf("%s %s %s: %d tasks at %.0f/s (stint ratio %.2f), want %d at > 0", scenarioConcurrent, metric, sys, r.Tasks, r.PerSec, r.StintRatio, cfg.concurrentN)
			}
		}
	}
	if r := find(scenarioConcurrent, metricConcurrentCli, "floor (20 conns, a row per statement)", 0); r.Tasks != int64(cfg.concurrentN) || r.StintRatio <= 0 {
		t.Errorf("%s floor: %d tasks, stint ratio %.2f, want %d and a ratio", scenarioConcurrent, r.Tasks, r.StintRatio, cfg.concurrentN)
	}
	total := cfg.latRate * int(cfg.latDur/time.Second)
	for _, c := range []struct{ metric, system string }{
		{"submit->stored", "stint (defaults)"}, {"submit->start", "stint (defaults)"}, {"submit->await", "stint (defaults)"},
		{"submit->start", "stint (defaults, server submits)"},
		{"submit->stored", "river (defaults)"}, {"submit->start", "river (defaults)"},
		{"submit->stored", "river (tuned)"}, {"submit->start", "river (tuned)"},
	} {
		r := find("latency", c.metric, c.system, 0)
		if r.Latency == nil || r.Latency.Count != total || r.Latency.P50MS <= 0 || r.Latency.P99MS < r.Latency.P50MS {
			t.Errorf("latency %s %s: %+v, want %d samples", c.metric, c.system, r.Latency, total)
		}
	}

	var table bytes.Buffer
	rep.writeTable(&table)
	t.Log("\n" + table.String())
	for _, want := range []string{"fsync=", "burn-down", "streaming", scenarioStreamingClient, "drain-burst", "latency", "scale 2 nodes", scenarioConcurrent, "STINT ÷ THIS"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Errorf("encode the report: %v", err)
	}
}

// newTestBench returns a bench with cfg whose databases are pgtest's.
func newTestBench(t *testing.T, cfg config) *bench {
	pgtest.New(t) // starts the cluster, so that AdminDSN has one
	return &bench{
		cfg: cfg,
		log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		db: &dbServer{admin: pgtest.AdminDSN(), source: "pgtest",
			create: func(context.Context, string) (string, error) { return pgtest.New(t), nil }},
		progress: t.Output(),
		warn:     t.Output(),
	}
}

// TestAggregate checks that runs sum up to the median and pooled samples.
func TestAggregate(t *testing.T) {
	raw := []Result{
		{Scenario: "burn-down", Metric: "work", System: sysStint, Tasks: 100, Seconds: 1, CPU: usage{50, 1, 10, 0.25, 0.5, 1000, 10, 20}},
		{Scenario: "latency", Metric: "submit->start", System: sysStint, Tasks: 2, samples: []time.Duration{time.Millisecond, 3 * time.Millisecond}, CPU: unknownUsage},
		{Scenario: "burn-down", Metric: "work", System: sysStint, Tasks: 100, Seconds: 4, CPU: usage{60, 2, 20, 0.75, 1.5, -1, -1, -1}},
		{Scenario: "burn-down", Metric: "work", System: sysRiver, Error: "boom"},
		{Scenario: "burn-down", Metric: "work", System: sysStint, Tasks: 100, Seconds: 2, CPU: usage{70, 3, 30, 0.5, 1, 3000, 30, 40}},
		{Scenario: "latency", Metric: "submit->start", System: sysStint, Tasks: 1, samples: []time.Duration{2 * time.Millisecond}, CPU: unknownUsage},
	}
	got := aggregate(raw)
	if len(got) != 3 {
		t.Fatalf("got %d rows, want 3: %+v", len(got), got)
	}
	if got[0].Error != "boom" {
		t.Errorf("error row: %+v", got[0])
	}
	bd := got[1]
	if bd.Runs != 3 || bd.Seconds != 2 || len(bd.PerRun) != 3 || bd.PerRun[1] != 25 || bd.CPU != (usage{60, 2, 20, 0.5, 1, 2000, -1, -1}) {
		t.Errorf("burn-down: %+v, want the median run of 3 (2 s), steal 20", bd)
	}
	if bd.Slowest != 25 || bd.SlowestOverMedian != 0.5 {
		t.Errorf("burn-down: slowest %.1f/s, %.2f of the median, want 25/s, 0.5 (25 of 50)", bd.Slowest, bd.SlowestOverMedian)
	}
	if math.Abs(bd.WALPerTask-20) > 1e-6 {
		t.Errorf("burn-down: %.1f bytes of WAL per task, want 20 (4,000 over the 200 tasks of the runs that measured it)", bd.WALPerTask)
	}
	if math.Abs(bd.SyncsPerTask-0.2) > 1e-6 || math.Abs(bd.CommitsPerTask-0.3) > 1e-6 {
		t.Errorf("burn-down: %.2f flushes and %.2f commits per task, want 0.2 and 0.3 (40 and 60 over the 200 tasks of the runs that measured them)", bd.SyncsPerTask, bd.CommitsPerTask)
	}
	if math.Abs(bd.GoUSPerTask-5000) > 1e-6 || math.Abs(bd.DBUSPerTask-10000) > 1e-6 {
		t.Errorf("burn-down: %.1f / %.1f us of CPU per task, want 5000 / 10000 (1.5 s and 3 s over 300 tasks)", bd.GoUSPerTask, bd.DBUSPerTask)
	}
	if bd.Noisy != 3 {
		t.Errorf("burn-down: %d noisy runs, want 3 (others and steal above 10%%)", bd.Noisy)
	}
	lat := got[2]
	if lat.Noisy != 0 {
		t.Errorf("latency: %d noisy runs, want 0 (usage unknown)", lat.Noisy)
	}
	if lat.Runs != 2 || lat.Tasks != 3 || lat.Latency == nil || lat.Latency.Count != 3 || lat.Latency.P50MS != 2 || lat.CPU != unknownUsage {
		t.Errorf("latency: %+v %+v, want 3 pooled samples with p50 2 ms", lat, lat.Latency)
	}
}

// TestRatios checks stint's ratios to the other systems, median and run by
// run, and the scale scenario's PostgreSQL CPU per task.
func TestRatios(t *testing.T) {
	raw := []Result{}
	// Three rounds: stint 300, 200, 100 tasks/s; River 100, 100, 100;
	// Graphile Worker 150 each.
	for _, stint := range []float64{300, 200, 100} {
		raw = append(raw,
			Result{Scenario: "burst", Metric: "work", System: sysStint, Tasks: int64(stint), Seconds: 1, CPU: unknownUsage},
			Result{Scenario: "burst", Metric: "work", System: sysRiver, Tasks: 100, Seconds: 1, CPU: unknownUsage},
			Result{Scenario: "burst", Metric: "work", System: sysGraphile, Tasks: 150, Seconds: 1, CPU: unknownUsage})
	}
	for _, x := range []struct {
		system     string
		nodes      int
		dbSecs     float64
		tasksOfRun int64
	}{
		{sysStint, 1, 0.1, 1000}, {sysStint, 4, 0.2, 1000}, {sysRiver, 1, 0.3, 1000}, {sysRiver, 2, 0.3, 1000}, {sysRiver, 4, 0.45, 1000},
	} {
		raw = append(raw, Result{Scenario: "scale", Metric: "work", System: x.system, Nodes: x.nodes, Tasks: x.tasksOfRun, Seconds: 1, CPU: usage{Ours: 50, DBSecs: x.dbSecs}})
	}
	// Latency: stint's first row (its client's submits) is the one the
	// peers' are compared with, not the server's own submits after it.
	for _, x := range []struct {
		system string
		p50    time.Duration
	}{{sysStint + " (defaults)", 2 * time.Millisecond}, {sysStint + " (defaults, server submits)", time.Millisecond}, {sysRiver + " (tuned)", 4 * time.Millisecond}} {
		raw = append(raw, Result{Scenario: "latency", Metric: "submit->start", System: x.system, Tasks: 1, samples: []time.Duration{x.p50}, CPU: unknownUsage})
	}
	rep := &Report{Results: aggregate(raw)}
	rep.computeRatios()
	byKey := map[string]Result{}
	for _, r := range rep.Results {
		byKey[fmt.Sprintf("%s %s %d", r.Scenario, r.System, r.Nodes)] = r
	}
	river, graphile := byKey["burst river 0"], byKey["burst graphile 0"]
	if river.StintRatio != 2 || river.StintRatioMin != 1 || !slices.Equal(river.StintRatioPerRun, []float64{3, 2, 1}) {
		t.Errorf("stint ÷ River: %.2f, runs %v (min %.2f), want 2, runs [3 2 1] (min 1)", river.StintRatio, river.StintRatioPerRun, river.StintRatioMin)
	}
	if math.Abs(graphile.StintRatio-200.0/150) > 1e-9 || math.Abs(graphile.StintRatioMin-100.0/150) > 1e-9 {
		t.Errorf("stint ÷ Graphile: %.3f (min %.3f), want 1.333 (min 0.667)", graphile.StintRatio, graphile.StintRatioMin)
	}
	if s := byKey["burst stint 0"]; s.StintRatio != 0 || s.Slowest != 100 || s.SlowestOverMedian != 0.5 {
		t.Errorf("stint's own row: ratio %.2f, slowest %.0f (%.2f of the median), want none, 100 (0.5)", s.StintRatio, s.Slowest, s.SlowestOverMedian)
	}
	if r := byKey["latency river (tuned) 0"]; r.StintRatio != 0.5 {
		t.Errorf("stint ÷ River tuned, latency p50: %.2f, want 0.5 (stint's client 2 ms over River's 4 ms)", r.StintRatio)
	}
	want := []ScaleCPU{{System: sysStint, Nodes: 4, OneUS: 100, NodesUS: 200, Ratio: 2}, {System: sysRiver, Nodes: 4, OneUS: 300, NodesUS: 450, Ratio: 1.5}}
	if len(rep.ScaleDBCPU) != len(want) {
		t.Fatalf("scale CPU: %+v, want %+v", rep.ScaleDBCPU, want)
	}
	for i, w := range want {
		g := rep.ScaleDBCPU[i]
		if g.System != w.System || g.Nodes != w.Nodes || math.Abs(g.OneUS-w.OneUS) > 1e-6 || math.Abs(g.NodesUS-w.NodesUS) > 1e-6 || math.Abs(g.Ratio-w.Ratio) > 1e-9 {
			t.Errorf("scale CPU %d: %+v, want %+v", i, g, w)
		}
	}
	var table bytes.Buffer
	rep.writeTable(&table)
	for _, line := range []string{"2.00× (runs 1.00–3.00×)", "4 nodes ÷ 1 node, stint: 200.0 ÷ 100.0 µs = 2.00×", "3: 100–300 (0.50×)"} {
		if !strings.Contains(table.String(), line) {
			t.Errorf("table lacks %q:\n%s", line, table.String())
		}
	}
}

// TestNoisy checks which shares of others and steal flag a run.
func TestNoisy(t *testing.T) {
	for _, c := range []struct {
		u    usage
		want bool
	}{
		{usage{Ours: 90, Others: 5, Steal: 5}, false},
		{usage{Ours: 80, Others: 10}, false},
		{usage{Ours: 80, Others: 10.5}, true},
		{usage{Ours: 80, Steal: 11}, true},
		{usage{Ours: 60, Others: 6, Steal: 6}, true},
		{unknownUsage, false},
	} {
		if got := c.u.noisy(); got != c.want {
			t.Errorf("%+v noisy = %v, want %v", c.u, got, c.want)
		}
	}
}

// TestParseFlags checks the scenario selection and validation.
func TestParseFlags(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.burndown || !c.streaming || !c.latency || !c.scale || !c.floor || !c.concurrent || c.fast {
		t.Errorf("defaults: %+v, want every scenario, durable", c)
	}
	c, err = parseFlags([]string{"--latency", "--scale-nodes", "1,3", "--systems", "stint"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.burndown || !c.latency || len(c.scaleNodes) != 2 || c.scaleNodes[1] != 3 || c.has(sysRiver) || !c.has(sysStint) {
		t.Errorf("picked: %+v", c)
	}
	c, err = parseFlags([]string{"--burst", "--systems", "stint, graphile"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.burst || c.drainBurst || c.streaming || !c.has(sysGraphile) || c.has(sysRiver) {
		t.Errorf("picked: %+v", c)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--n", "0"}, "--n must be positive"},
		{[]string{"--systems", "sidekiq"}, `unknown system "sidekiq" (want stint, river, graphile, floor, pgboss or dbos)`},
		{[]string{"--systems", "stint,graphile-worker"}, `unknown system "graphile-worker"`},
		{[]string{"--scale-nodes", "x"}, "--scale-nodes"},
		{[]string{"--burst-n", "0"}, "--burst-n must be positive"},
		{[]string{"--burst-batch", "-5"}, "--burst-batch must be positive"},
		{[]string{"--drain-cycles", "0"}, "--drain-cycles must be positive"},
		{[]string{"--graphile-processes", "0"}, "--graphile-processes must be positive"},
		{[]string{"--latency-submit", "browser"}, `unknown submitter "browser"`},
		{[]string{"--burst-n", "many"}, "invalid value"},
		{[]string{"--no-such-flag"}, "not defined"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		var stderr bytes.Buffer
		_, err := parseFlags(bad.args, &stderr)
		if err == nil {
			t.Errorf("%q: no error", bad.args)
			continue
		}
		if msg := err.Error() + stderr.String(); !strings.Contains(msg, bad.want) {
			t.Errorf("%q: error %q (stderr %q), want it to say %q", bad.args, err, stderr.String(), bad.want)
		}
	}
}

// TestRunRejectsBadFlags checks that the command exits 2 on a bad flag,
// saying why, before it starts anything.
func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--systems", "stint,sidekiq"}, {"--burst-n", "0"}} {
		var out, errs bytes.Buffer
		if code := run(args, &out, &errs); code != 2 {
			t.Errorf("%q: exit code %d, want 2", args, code)
		}
		if !strings.HasPrefix(errs.String(), "stint-bench: --") || out.Len() != 0 {
			t.Errorf("%q: stdout %q, stderr %q, want only the error on stderr", args, out.String(), errs.String())
		}
	}
}

// TestRunOnServer runs the command itself against an existing server
// (--db), as JSON, and checks that it drops the databases it created.
func TestRunOnServer(t *testing.T) {
	pgtest.New(t)
	admin := pgtest.AdminDSN()
	var out, errs bytes.Buffer
	code := run([]string{"--db", admin, "--burndown", "--systems", "stint", "--n", "300", "--runs", "2", "--json"}, &out, &errs)
	if code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s\nstdout:\n%s", code, errs.String(), out.String())
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("decode the JSON report: %v\n%s", err, out.String())
	}
	if rep.Postgres.Fsync == "" || !strings.Contains(rep.Postgres.Source, "--db") {
		t.Errorf("settings: %+v", rep.Postgres)
	}
	if len(rep.Results) != 2 {
		t.Fatalf("results: %+v, want burn-down insert and work", rep.Results)
	}
	for _, r := range rep.Results {
		if r.Runs != 2 || r.Tasks != 300 || r.PerSec <= 0 || len(r.PerRun) != 2 {
			t.Errorf("%s %s: %+v, want 2 runs of 300 tasks", r.Scenario, r.Metric, r)
		}
	}
	conn, err := pgx.Connect(context.Background(), admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var left int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_database WHERE datname LIKE 'stintbench\_%'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d benchmark databases left behind", left)
	}
}

// TestDrainPollSeesTasksBeforeItsResumePoint checks that a poll resuming
// where the last one found a pending task still sees one that is pending
// before that point, and says none is left only when none is.
func TestDrainPollSeesTasksBeforeItsResumePoint(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.New(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	exec := func(q string) {
		t.Helper()
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE TABLE drain (n int PRIMARY KEY, pending bool NOT NULL)`)
	exec(`INSERT INTO drain SELECT n, n = 3000 FROM generate_series(1, 3000) AS n`)
	p := drainPoll{pool: pool, q: queries{pendingFrom: `SELECT ctid::text FROM drain WHERE ctid >= $1::tid AND pending LIMIT 1`}}
	poll := func(want bool) {
		t.Helper()
		left, err := p.pending(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if left != want {
			t.Fatalf("pending = %v, want %v (resume point %s)", left, want, p.from)
		}
	}
	poll(true)
	if p.from == "(0,0)" {
		t.Fatalf("the poll did not move its resume point to the pending row")
	}
	// The last row is done, the first pending: before the resume point.
	exec(`UPDATE drain SET pending = (n = 1)`)
	poll(true)
	poll(true)
	exec(`UPDATE drain SET pending = false`)
	poll(false)
}

// The SQL profile shows each statement's buffer hits per call, a zero
// count of calls included.
func TestSQLProfileTable(t *testing.T) {
	t.Parallel()
	rep := &Report{SQL: []SQLProfile{{Run: "stint scale 4 nodes", WallSecs: 2, Statements: []Statement{
		{Query: "SELECT   claim", Calls: 4, TotalMS: 8, MeanMS: 2, MaxMS: 3, Rows: 4_000, BlocksHit: 10_000},
		{Query: "SELECT never", BlocksHit: 7},
	}}}}
	var out strings.Builder
	rep.writeTable(&out)
	for _, want := range []string{
		`(?m)^\s+calls\s+total ms\s+mean ms\s+max ms\s+rows\s+blocks hit/call\s+query$`,
		`(?m)^\s+4\s+8\s+2\.000\s+3\.0\s+4,000\s+2500\s+SELECT   claim$`,
		`(?m)^\s+0\s+0\s+0\.000\s+0\.0\s+0\s+7\s+SELECT never$`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("the SQL profile has no line matching %s:\n%s", want, out.String())
		}
	}
}
