package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// envDBOS, set to 1, lets the tests build DBOS's runner; without it they
// run DBOS only when the runner is built already (stint-bench with
// --systems ...,dbos builds it into the cache folder), so that CI does
// not spend minutes compiling DBOS.
const envDBOS = "STINT_BENCH_DBOS"

// dbosTestConfig sets cfg to run DBOS as far as the tests may: reports
// whether its runner is there (or may be built).
func dbosTestConfig(t *testing.T, cfg *config) bool {
	t.Helper()
	cfg.dbos.noBuild = os.Getenv(envDBOS) != "1"
	_, err := dbosRunner(context.Background(), "", cfg.dbos.noBuild, t.Logf)
	if err != nil {
		t.Logf("DBOS skipped: %v (set %s=1 to build it)", err, envDBOS)
		return false
	}
	return true
}

// runByKey runs the bench with cfg, requires every row to have no error
// and returns the report and its rows by scenario|metric|system.
func runByKey(t *testing.T, ctx context.Context, cfg config) (*Report, map[string]Result) {
	t.Helper()
	rep, err := newTestBench(t, cfg).run(ctx)
	require.NoError(t, err)
	got := map[string]Result{}
	for _, r := range rep.Results {
		require.Empty(t, r.Error, "%s %s %s", r.Scenario, r.Metric, r.System)
		got[r.Scenario+"|"+r.Metric+"|"+r.System] = r
	}
	return rep, got
}

// TestSignalsScenarios runs the signals scenarios at a tiny size on stint
// and, when its runner is built, DBOS, and checks that every row is there
// with its samples and stint's ratios.
func TestSignalsScenarios(t *testing.T) {
	cfg := defaultConfig()
	cfg.systems = "stint,dbos"
	withDBOS := dbosTestConfig(t, &cfg)
	cfg.sig = signalsConfig{on: true, resume: 8, warmup: 2, tasks: 60, senders: 4, events: 8, eventGap: time.Millisecond}
	cfg.timeout = 2 * time.Minute
	cfg.runs = 1
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, got := runByKey(t, ctx, cfg)
	systems := []string{sysStint}
	if withDBOS {
		systems = append(systems, sysDBOS)
	} else {
		require.Len(t, rep.Notes, 1)
		require.Contains(t, rep.Notes[0], "DBOS not run")
	}
	many := cfg.sig.scenarioMany()
	for _, sys := range systems {
		for _, c := range []struct {
			scenario, metric string
			n                int
		}{{scenarioResume, metricResume, 8}, {scenarioEvent, metricEvent, 8}} {
			r, ok := got[c.scenario+"|"+c.metric+"|"+sys]
			require.True(t, ok, "no row %s %s %s", c.scenario, c.metric, sys)
			require.NotNil(t, r.Latency, "%s %s", c.scenario, sys)
			require.Equal(t, c.n, r.Latency.Count, "%s %s: the warm-up is left out", c.scenario, sys)
			require.Positive(t, r.Latency.P50MS, "%s %s", c.scenario, sys)
			if sys != sysStint {
				require.Positive(t, r.StintRatio, "%s %s: stint's ratio", c.scenario, sys)
			}
		}
		peers := []string{sys, sysStintMany}
		if sys == sysDBOS {
			peers = []string{sys, sysDBOSSendBulk}
		}
		for _, p := range peers {
			for _, metric := range []string{metricSent, metricFinished} {
				r, ok := got[many+"|"+metric+"|"+p]
				require.True(t, ok, "no row %s %s %s", many, metric, p)
				require.EqualValues(t, 60, r.Tasks, "%s %s", metric, p)
				require.Positive(t, r.PerSec, "%s %s", metric, p)
				if !strings.HasPrefix(p, sysStint) {
					require.Positive(t, r.StintRatio, "%s %s: stint's ratio", metric, p)
				}
			}
		}
	}
	var table bytes.Buffer
	rep.writeTable(&table)
	t.Log("\n" + table.String())
	require.Contains(t, table.String(), "DBOS Transact for Go "+dbosVersion, "the table says which DBOS and how it was tuned")
	require.Contains(t, table.String(), "signals:", "the table describes the signals scenarios")
}

// TestDBOSQueueScenarios runs DBOS's burn-down, streaming and latency at a
// tiny size, when its runner is built, and checks their counts and
// stint's ratios.
func TestDBOSQueueScenarios(t *testing.T) {
	cfg := defaultConfig()
	cfg.systems = "stint,dbos"
	if !dbosTestConfig(t, &cfg) {
		t.Skip("DBOS's runner is not built")
	}
	cfg.burndown, cfg.streaming, cfg.latency = true, true, true
	const n = 300
	cfg.n, cfg.batch = n, 100
	cfg.streamDur, cfg.streamWarmup = time.Second, time.Second
	cfg.streamBatch, cfg.streamBacklog = 100, 300
	cfg.latRate, cfg.latDur, cfg.latWarmup = 20, time.Second, 0
	cfg.latSubmit = "client"
	cfg.timeout = 2 * time.Minute
	cfg.runs = 1
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	_, got := runByKey(t, ctx, cfg)
	for _, c := range []struct {
		scenario, metric, system string
		tasks                    int64 // 0: some
	}{
		{"burn-down", "insert", sysDBOS, n}, {"burn-down", "work", sysDBOS, n},
		{"streaming", "work", sysDBOS, 0}, {scenarioStreamingClient, "work", sysDBOS, 0},
	} {
		r, ok := got[c.scenario+"|"+c.metric+"|"+c.system]
		require.True(t, ok, "no row %s %s %s", c.scenario, c.metric, c.system)
		require.Positive(t, r.PerSec, "%s %s", c.scenario, c.metric)
		require.Positive(t, r.StintRatio, "%s %s: stint's ratio", c.scenario, c.metric)
		if c.tasks > 0 {
			require.Equal(t, c.tasks, r.Tasks, "%s %s", c.scenario, c.metric)
		}
	}
	for _, system := range []string{sysDBOS + " (defaults)", sysDBOS + " (tuned)"} {
		for _, metric := range []string{"submit->stored", "submit->start", "submit->await"} {
			r, ok := got["latency|"+metric+"|"+system]
			require.True(t, ok, "no latency row %s %s", metric, system)
			require.Equal(t, 20, r.Latency.Count, "%s %s", metric, system)
			require.Positive(t, r.StintRatio, "%s %s: stint's ratio", metric, system)
		}
	}
}

// TestSignalsFlags checks that the signals scenarios run only when picked,
// alone, and that bad flags are refused.
func TestSignalsFlags(t *testing.T) {
	t.Parallel()
	c, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	require.False(t, c.sig.on, "the signals scenarios run only when picked")
	c, err = parseFlags([]string{"--signals", "--systems", "stint,dbos", "--signals-tasks", "500", "--dbos-poll", "5ms"}, io.Discard)
	require.NoError(t, err)
	require.True(t, c.sig.on && c.has(sysDBOS))
	require.False(t, c.burndown || c.latency || c.wf.on, "--signals alone picks only the signals scenarios")
	require.Equal(t, 500, c.sig.tasks)
	require.Equal(t, 5*time.Millisecond, c.dbos.poll)
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--signals", "--signals-tasks", "0"}, "--signals-tasks must be positive"},
		{[]string{"--signals", "--signals-warmup", "-1"}, "must not be negative"},
		{[]string{"--signals", "--systems", "dbos"}, "--systems must include stint"},
		{[]string{"--dbos-coalesce", "100us"}, "at least 1ms"},
	} {
		var stderr bytes.Buffer
		_, err := parseFlags(bad.args, &stderr)
		require.Error(t, err, "%q", bad.args)
		require.True(t, strings.Contains(err.Error()+stderr.String(), bad.want), "%q: %v", bad.args, err)
	}
}
