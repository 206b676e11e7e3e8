package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFlowScenarios runs the flow-control scenarios at a tiny size and
// checks that the counts add up and that the rules held in every run: the
// cluster cap bounds the runs at once across node processes, the rate
// limit the starts in any second, and fair share the big key's tasks
// that start ahead of a small key's.
func TestFlowScenarios(t *testing.T) {
	cfg := defaultConfig()
	cfg.systems = sysStint
	f := &cfg.flow
	f.limitsCost, f.globalCap, f.rate, f.fair = true, true, true, true
	f.costN = 500
	// 2 nodes of 3 workers under a cap of 4: without the cap 6 could run.
	f.capN, f.capNodes, f.capWorkers, f.capMax, f.capSleep = 60, 2, 3, 4, 20*time.Millisecond
	// 350 tasks at 100/s: 100 at once, then 2.5 s at the limit.
	f.rateLimit, f.rateN = 100, 350
	// The fair scenario's claims take at most 20 tasks.
	f.fairN, f.fairRate, f.fairWorkers = 5_000, 20, 20
	cfg.batch = 200
	cfg.timeout = time.Minute
	cfg.runs = 1

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := newTestBench(t, cfg).run(ctx)
	require.NoError(t, err)
	for _, r := range rep.Results {
		require.Empty(t, r.Error, "%s %s", r.Scenario, r.System)
	}
	find := func(scenario, metric, system string) Result {
		t.Helper()
		for _, r := range rep.Results {
			if r.Scenario == scenario && r.Metric == metric && r.System == system {
				return r
			}
		}
		t.Fatalf("no result for %s %s %s", scenario, metric, system)
		return Result{}
	}
	check := func(scenario, system, what string) Check {
		t.Helper()
		for _, c := range rep.Checks {
			if c.Scenario == scenario && c.System == system && c.What == what {
				return c
			}
		}
		t.Fatalf("no check %q of %s %s in %+v", what, scenario, system, rep.Checks)
		return Check{}
	}

	for _, c := range []struct {
		scenario, system, base string
		tasks                  int64
	}{
		{"limits-cost", sysWithLimits, sysNoLimits, 500},
		{"limits-cost", sysNoLimits, "", 500},
		{"global-cap", sysCapped, sysNoCap, 60},
		{"global-cap", sysNoCap, "", 60},
	} {
		r := find(c.scenario, "work", c.system)
		require.Equal(t, c.tasks, r.Tasks, "%s %s", c.scenario, c.system)
		require.Positive(t, r.PerSec, "%s %s", c.scenario, c.system)
		require.Equal(t, c.base, r.Base)
		if c.base != "" {
			require.Positive(t, r.BaseRatio, "%s %s: no ratio to %s", c.scenario, c.system, c.base)
		}
	}

	capped := check("global-cap", sysCapped, "most tasks running at once, all nodes")
	require.Equal(t, 4.0, capped.Bound)
	require.Positive(t, capped.Value)
	require.LessOrEqual(t, capped.Value, 4.0, "the cluster cap of 4 let more run at once")
	require.LessOrEqual(t, check("global-cap", sysNoCap, "most tasks running at once, all nodes").Value, 6.0)

	rate := find("rate", "rate after the first period", sysStint)
	require.Positive(t, rate.PerSec)
	require.Equal(t, 100.0, rate.Bound)
	require.Positive(t, rate.BoundRatio)
	for _, what := range []string{"most starts in any 1s", "most starts in any 1s after the first period"} {
		c := check("rate", sysStint, what)
		require.Equal(t, 200.0, c.Bound, what)
		require.Positive(t, c.Value, what)
		require.False(t, c.Over, "%s: %.0f starts, above the rule's 200", what, c.Value)
	}

	big := find("fair", "big key: work", sysBigSmall)
	require.Equal(t, int64(5_000), big.Tasks)
	require.Positive(t, big.BaseRatio)
	require.Equal(t, int64(5_000), find("fair", "big key: work", sysBigAlone).Tasks)
	small := find("fair", "small key: submit->start", sysBigSmall)
	require.NotNil(t, small.Latency)
	require.Positive(t, small.Latency.Count)
	require.EqualValues(t, small.Tasks, small.Latency.Count)
	// With fair share a small-key task waits for the claims under way,
	// tens of tasks at 20 a claim; without it, for the big key's backlog.
	ahead := check("fair", sysBigSmall, "most big-key tasks started between a small-key task's submit and its start")
	require.Less(t, ahead.Value, 5_000.0/4, "big-key tasks started ahead of a small-key one")

	var table bytes.Buffer
	rep.writeTable(&table)
	t.Log("\n" + table.String())
	for _, want := range []string{"limits-cost:", "÷ stint, no cap:", "÷ limit 100/s:", "Flow-control checks, every run:", "rule: at most 200", "small key: submit->start"} {
		require.Contains(t, table.String(), want)
	}
	_, err = json.Marshal(rep)
	require.NoError(t, err)
}

// TestRateFigures checks the rate scenario's figures on start times of a
// known shape: a burst of the limit, then one start per tenth of a second.
func TestRateFigures(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	var starts []time.Time
	for range 10 {
		starts = append(starts, t0)
	}
	for k := 1; k <= 40; k++ {
		starts = append(starts, t0.Add(time.Duration(k)*100*time.Millisecond))
	}
	rs := rateFigures(starts, 10, time.Second)
	require.Equal(t, 20, rs.bound)
	require.Equal(t, 19, rs.most, "the burst of 10 and the 9 starts of the rest of its second")
	require.Equal(t, 10, rs.mostSteady)
	require.EqualValues(t, 30, rs.steady, "the starts after the first second")
	require.InDelta(t, 3.0, rs.steadySecs, 1e-9)

	require.Equal(t, rateStats{bound: 20}, rateFigures(nil, 10, time.Second))
}

// TestMostAtOnce checks the count of overlapping runs, and the parsing of
// the lines node processes report them in.
func TestMostAtOnce(t *testing.T) {
	for _, c := range []struct {
		spans []span
		want  int
	}{
		{nil, 0},
		{[]span{{0, 10}}, 1},
		{[]span{{0, 10}, {10, 20}, {20, 30}}, 1}, // one ends as the next starts
		{[]span{{0, 10}, {5, 15}, {9, 12}, {12, 20}}, 3},
		{[]span{{0, 100}, {1, 2}, {3, 4}, {5, 6}}, 2},
	} {
		require.Equal(t, c.want, mostAtOnce(c.spans), "%v", c.spans)
	}

	rec := newFlowRecorder()
	rec.ran(time.Unix(0, 5), time.Unix(0, 9))
	rec.ran(time.Unix(0, 7), time.Unix(0, 20))
	var out bytes.Buffer
	require.NoError(t, rec.writeSpans(&out))
	var got []span
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		s, ok := parseSpan(line)
		require.True(t, ok, line)
		got = append(got, s)
	}
	require.Equal(t, []span{{5, 9}, {7, 20}}, got)
	for _, bad := range []string{"span 1", "span a 2", "span 5 4", "spam 1 2", "span 1 2 3"} {
		_, ok := parseSpan(bad)
		require.False(t, ok, bad)
	}
}

// TestFlowFlags checks that the flow-control scenarios run only when
// picked, alone when picked, and that bad values are refused with exit
// code 2 before anything starts.
func TestFlowFlags(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	require.False(t, c.flow.picked(), "the flow-control scenarios run only when picked")

	c, err = parseFlags([]string{"--rate", "--rate-limit", "50", "--latency-rate", "7"}, io.Discard)
	require.NoError(t, err)
	require.True(t, c.flow.rate)
	require.False(t, c.burndown || c.latency || c.scale || c.flow.fair, "--rate alone picks only the rate scenario")
	require.Equal(t, 50, c.flow.rateLimit)
	require.Equal(t, 7, c.latRate)

	c, err = parseFlags([]string{"--flow"}, io.Discard)
	require.NoError(t, err)
	require.True(t, c.flow.limitsCost && c.flow.globalCap && c.flow.rate && c.flow.fair, "--flow picks the four")
	require.False(t, c.burndown || c.scale)

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--rate", "--rate-limit", "0"}, "--rate-limit must be positive"},
		{[]string{"--global-cap-max", "-1"}, "--global-cap-max must be positive"},
		{[]string{"--global-cap-sleep", "0s"}, "--global-cap-sleep must be positive"},
		{[]string{"--fair-rate", "0"}, "--fair-rate must be positive"},
		{[]string{"--limits-n", "0"}, "--limits-n must be positive"},
		{[]string{"--fair-workers", "-1"}, "--fair-workers must not be negative"},
		{[]string{"--fair", "--systems", "river"}, "--systems must include stint"},
		{[]string{"--rate", "1000"}, "unexpected arguments"},
		{[]string{"--rate", "--rate-n", "2000", "--rate-limit", "1000"}, "--rate-n (2000) must be more than twice --rate-limit (1000)"},
	} {
		var stderr bytes.Buffer
		_, err := parseFlags(bad.args, &stderr)
		require.Error(t, err, "%q", bad.args)
		require.Contains(t, err.Error()+stderr.String(), bad.want, "%q", bad.args)

		var out, errs bytes.Buffer
		require.Equal(t, 2, run(bad.args, &out, &errs), "%q", bad.args)
		require.Empty(t, out.String(), "%q", bad.args)
		require.True(t, strings.HasPrefix(errs.String(), "stint-bench: "), "%q: stderr %q", bad.args, errs.String())
	}
}
