package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Report is the outcome of a benchmark run; --json prints it as is.
type Report struct {
	Started  time.Time     `json:"started"`
	Postgres Settings      `json:"postgres"`
	Config   ConfigSummary `json:"config"`
	Results  []Result      `json:"results"`
	// ScaleDBCPU compares PostgreSQL's CPU time per task of the most node
	// processes with that of one, per system: the work is the same, so
	// what grows is the nodes' contention.
	ScaleDBCPU []ScaleCPU   `json:"scale_db_cpu,omitempty"`
	SQL        []SQLProfile `json:"sql_profiles,omitempty"`
	Profiles   []string     `json:"cpu_profiles,omitempty"`
	Notes      []string     `json:"notes,omitempty"`
	// Checks are the flow-control scenarios' figures of every run held to
	// their rules.
	Checks []Check `json:"checks,omitempty"`
}

// ConfigSummary describes how each system and scenario was configured.
type ConfigSummary struct {
	Stint    string `json:"stint"`
	River    string `json:"river"`
	Graphile string `json:"graphile"`
	// DBOS describes DBOS Transact for Go's tuning.
	DBOS       string `json:"dbos"`
	Floor      string `json:"floor"`
	BurnDown   string `json:"burn_down"`
	Streaming  string `json:"streaming"`
	Burst      string `json:"burst"`
	DrainBurst string `json:"drain_burst"`
	Latency    string `json:"latency"`
	Scale      string `json:"scale"`
	// Concurrent describes the concurrent-submit scenario.
	Concurrent string `json:"concurrent_submit"`
	// Shapes describes the shape matrix.
	Shapes     string `json:"shapes,omitempty"`
	LimitsCost string `json:"limits_cost,omitempty"`
	GlobalCap  string `json:"global_cap,omitempty"`
	Rate       string `json:"rate,omitempty"`
	Fair       string `json:"fair,omitempty"`
	// Signals describes the durable-wait scenarios.
	Signals string `json:"signals,omitempty"`
	Runs    string `json:"runs"`
}

// Result is one row: one metric of one scenario on one system.
type Result struct {
	Scenario string `json:"scenario"`
	// Metric is insert, work, submit->stored, submit->start or
	// submit->await.
	Metric string `json:"metric,omitempty"`
	System string `json:"system"`
	// Nodes is the number of node processes (scale only).
	Nodes int `json:"nodes,omitempty"`
	// Runs is how many runs the row sums up. Tasks and Seconds are those of
	// the median run (latency: all runs' tasks); PerRun lists every run's
	// tasks/s in the order they ran.
	Runs    int       `json:"runs,omitempty"`
	Tasks   int64     `json:"tasks,omitempty"`
	Seconds float64   `json:"seconds,omitempty"`
	PerSec  float64   `json:"tasks_per_sec,omitempty"`
	PerRun  []float64 `json:"per_run_tasks_per_sec,omitempty"`
	// Slowest is the slowest run's tasks/s and SlowestOverMedian that over
	// the median's (throughput rows of more than one run).
	Slowest           float64  `json:"slowest_tasks_per_sec,omitempty"`
	SlowestOverMedian float64  `json:"slowest_over_median,omitempty"`
	Latency           *Latency `json:"latency,omitempty"`
	// CPU is how the machine's CPU time went during the measured windows
	// (mean over runs).
	CPU usage `json:"cpu"`
	// GoUSPerTask and DBUSPerTask are the CPU time per task, in
	// microseconds, of the Go processes (the harness with the system it
	// runs in-process, and node processes) and of PostgreSQL, over all
	// runs.
	GoUSPerTask float64 `json:"go_cpu_us_per_task,omitempty"`
	DBUSPerTask float64 `json:"db_cpu_us_per_task,omitempty"`
	// WALPerTask is the WAL the cluster wrote per task, in bytes, over all
	// runs.
	WALPerTask float64 `json:"wal_bytes_per_task,omitempty"`
	// SyncsPerTask and CommitsPerTask are the WAL flushes to disk and the
	// transactions the cluster committed per task, over all runs that
	// measured them.
	SyncsPerTask   float64 `json:"wal_syncs_per_task,omitempty"`
	CommitsPerTask float64 `json:"commits_per_task,omitempty"`
	// Noisy counts the runs in which other processes and steal took more
	// than noisyPct of the CPU time.
	Noisy int `json:"noisy_runs,omitempty"`
	// StintRatio is stint's figure divided by this row's, on rows of other
	// systems: tasks/s for throughput (above 1: stint is faster), p50 for
	// latency (below 1: stint is quicker); StintRatioP99 is the p99 one.
	StintRatio    float64 `json:"stint_ratio,omitempty"`
	StintRatioP99 float64 `json:"stint_ratio_p99,omitempty"`
	// StintRatioPerRun is stint's tasks/s over this row's run by run (the
	// systems' i-th runs ran in the same round), and StintRatioMin the
	// least of them; only where both rows have every run.
	StintRatioPerRun []float64 `json:"stint_ratio_per_run,omitempty"`
	StintRatioMin    float64   `json:"stint_ratio_min,omitempty"`
	// Base is the system of the row, in the same scenario and metric,
	// that this one is measured against (the flow-control scenarios: the
	// same work without what they measure); BaseRatio is this row's tasks/s
	// over that row's, the medians', BaseRatioPerRun run by run and
	// BaseRatioMin the least of those.
	Base            string    `json:"base,omitempty"`
	BaseRatio       float64   `json:"base_ratio,omitempty"`
	BaseRatioPerRun []float64 `json:"base_ratio_per_run,omitempty"`
	BaseRatioMin    float64   `json:"base_ratio_min,omitempty"`
	// Bound is the rate a rule holds this row to, in tasks/s (the rate
	// scenario: the limit), and BoundRatio the median's tasks/s over it.
	Bound      float64 `json:"bound_tasks_per_sec,omitempty"`
	BoundRatio float64 `json:"bound_ratio,omitempty"`
	Error      string  `json:"error,omitempty"`

	samples []time.Duration // latency samples of one run
}

// aggregate turns the rows of single runs into one row per scenario, metric,
// system and node count, in the order they first ran: the median run by
// tasks/s (the upper middle one for an even count), or for latency the
// summary of all runs' samples pooled. Failed runs stay rows of their own.
func aggregate(raw []Result) []Result {
	key := func(x Result) string { return fmt.Sprintf("%s|%s|%s|%d", x.Scenario, x.Metric, x.System, x.Nodes) }
	var order []string
	groups := map[string][]Result{}
	var out []Result
	for _, x := range raw {
		if x.Error != "" {
			out = append(out, x)
			continue
		}
		k := key(x)
		if _, seen := groups[k]; !seen {
			order = append(order, k)
		}
		groups[k] = append(groups[k], x)
	}
	for _, k := range order {
		runs := groups[k]
		var cpu usage
		cpuN := 0
		var cpuTasks, walTasks, syncTasks, commitTasks int64
		var wal, syncs, commits float64
		walN := 0
		noisy := 0
		for _, x := range runs {
			if x.CPU.noisy() {
				noisy++
			}
			if x.CPU.WALBytes >= 0 {
				wal += x.CPU.WALBytes
				walTasks += x.Tasks
				walN++
			}
			if x.CPU.WALSyncs >= 0 {
				syncs += x.CPU.WALSyncs
				syncTasks += x.Tasks
			}
			if x.CPU.Commits >= 0 {
				commits += x.CPU.Commits
				commitTasks += x.Tasks
			}
			if x.CPU.Steal >= 0 {
				cpu.Ours += x.CPU.Ours
				cpu.Others += x.CPU.Others
				cpu.Steal += x.CPU.Steal
				cpu.GoSecs += x.CPU.GoSecs
				cpu.DBSecs += x.CPU.DBSecs
				cpuTasks += x.Tasks
				cpuN++
			}
		}
		var row Result
		if runs[0].samples != nil {
			row = runs[0]
			row.Tasks = 0
			var all []time.Duration
			for _, x := range runs {
				row.Tasks += x.Tasks
				all = append(all, x.samples...)
			}
			row.Latency = summarize(all)
		} else {
			perRun := make([]float64, len(runs))
			for i, x := range runs {
				if x.Seconds > 0 {
					perRun[i] = float64(x.Tasks) / x.Seconds
				}
			}
			idx := make([]int, len(runs))
			for i := range idx {
				idx[i] = i
			}
			slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(perRun[a], perRun[b]) })
			row = runs[idx[len(idx)/2]]
			if len(runs) > 1 {
				row.PerRun = perRun
				if median := perRun[idx[len(idx)/2]]; median > 0 {
					row.Slowest = perRun[idx[0]]
					row.SlowestOverMedian = row.Slowest / median
				}
			}
		}
		row.Runs = len(runs)
		row.Noisy = noisy
		row.samples = nil
		row.CPU = unknownUsage
		if cpuN > 0 {
			n := float64(cpuN)
			row.CPU = usage{Ours: cpu.Ours / n, Others: cpu.Others / n, Steal: cpu.Steal / n, GoSecs: cpu.GoSecs / n, DBSecs: cpu.DBSecs / n, WALBytes: -1, WALSyncs: -1, Commits: -1}
		}
		if walTasks > 0 {
			row.CPU.WALBytes = wal / float64(walN)
			row.WALPerTask = wal / float64(walTasks)
		}
		if syncTasks > 0 {
			row.SyncsPerTask = syncs / float64(syncTasks)
		}
		if commitTasks > 0 {
			row.CommitsPerTask = commits / float64(commitTasks)
		}
		if cpuTasks > 0 {
			row.GoUSPerTask = 1e6 * cpu.GoSecs / float64(cpuTasks)
			row.DBUSPerTask = 1e6 * cpu.DBSecs / float64(cpuTasks)
		}
		out = append(out, row)
	}
	return out
}

// Latency summarizes a latency sample, in milliseconds.
type Latency struct {
	Count  int     `json:"count"`
	P50MS  float64 `json:"p50_ms"`
	P90MS  float64 `json:"p90_ms"`
	P99MS  float64 `json:"p99_ms"`
	MaxMS  float64 `json:"max_ms"`
	MeanMS float64 `json:"mean_ms"`
}

// summarize computes the percentiles (nearest rank) of ds.
func summarize(ds []time.Duration) *Latency {
	if len(ds) == 0 {
		return &Latency{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	pct := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return ms(s[min(max(i, 0), len(s)-1)])
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return &Latency{Count: len(s), P50MS: pct(0.50), P90MS: pct(0.90), P99MS: pct(0.99),
		MaxMS: ms(s[len(s)-1]), MeanMS: ms(sum / time.Duration(len(s)))}
}

// summary describes the configuration for the report.
func (c config) summary() ConfigSummary {
	stint := "impl.Server at its default ServerConfig"
	var over []string
	if c.stintWorkers > 0 {
		over = append(over, fmt.Sprintf("MaxWorkers %d", c.stintWorkers))
	}
	if c.stintPoll > 0 {
		over = append(over, fmt.Sprintf("PollInterval %s", c.stintPoll))
	}
	if c.stintCooldown > 0 {
		over = append(over, fmt.Sprintf("FetchCooldown %s", c.stintCooldown))
	}
	if c.stintClaims > 0 {
		over = append(over, fmt.Sprintf("ClaimConcurrency %d", c.stintClaims))
	}
	if c.stintMaxConns > 0 {
		over = append(over, fmt.Sprintf("pool %d conns", c.stintMaxConns))
	}
	if len(over) > 0 {
		stint = "impl.Server with " + strings.Join(over, ", ") + " (latency: defaults)"
	}
	stint += "; submits through an impl.Client on its own pool; no-op behavior"
	pool := "pgxpool default size"
	if c.riverMaxConns > 0 {
		pool = fmt.Sprintf("pool %d conns", c.riverMaxConns)
	}
	river := fmt.Sprintf("MaxWorkers %d, FetchCooldown %s, FetchPollInterval %s (tuned; latency also at defaults), %s; inserts through an insert-only client on its own pool; no-op worker",
		c.riverWorkers, c.riverCooldown, c.riverPoll, pool)
	graphile := fmt.Sprintf("graphile-worker %s on Node.js, %d worker processes, each with concurrentJobs 24, a pool of 25 connections, localQueue size 500 and completeJobBatchDelay and failJobBatchDelay 0 (its performance documentation's tuning); jobs added with batched addJobs from a client process; no-op task", graphileVersion, c.graphileProcs)
	s := ConfigSummary{
		Stint:    stint,
		River:    river,
		Graphile: graphile,
		DBOS:     c.dbos.summary(),
		Burst: fmt.Sprintf("%s tasks submitted by the worker side itself (stint: the server node's SubmitMany; River: the working client's InsertMany; Graphile Worker: addJobs in its first worker process) in calls of %s, as fast as it can, while it works them; from its start on an empty database until none is left",
			num(int64(c.burstN)), num(int64(c.burstBatch))),
		DrainBurst: fmt.Sprintf("%d cycles of (queue empty, ANALYZE, a burst of %s tasks from a client process in calls of %s) while working; all the tasks over the sum of the cycles' times, each from its burst's start until none is left",
			c.drainCycles, num(int64(c.burstN)), num(int64(c.burstBatch))),
		Floor:     fmt.Sprintf("stint's tables without checks, feed or notifications; insert unnest %s/statement (tasks and hints); %d goroutines claim %s (hints FOR UPDATE SKIP LOCKED, one lease row) and complete (UPDATE FROM unnest)", num(int64(c.batch)), c.floorWorkers, num(int64(c.floorClaim))),
		BurnDown:  fmt.Sprintf("%s tasks inserted in batches of %s, then worked; done = no pending task, polled every %s", num(int64(c.n)), num(int64(c.batch)), c.pollEvery),
		Streaming: fmt.Sprintf("batches of %s inserted by a separate client (backlog at most %s) while working; %s warm-up, then a %s window; \"client process\" rows: the client in a process of its own (Graphile Worker's always is)", num(int64(c.streamBatch)), num(int64(c.streamBacklog)), c.streamWarmup, c.streamDur),
		Latency:   fmt.Sprintf("%d single tasks/s for %s after a %s warm-up; start recorded in the task's run", c.latRate, c.latDur, c.latWarmup),
		Scale:     fmt.Sprintf("%s tasks inserted, then worked by %v node processes", num(int64(c.scaleN)), c.scaleNodes),
		Concurrent: fmt.Sprintf("%s callers released together, each submitting one task (stint: Submit; River: Insert), from a client on its own pool (%q) and from the working process (%q), while it works; from the release until the last returned; floor: %d connections inserting a row per durable statement",
			num(int64(c.concurrentN)), metricConcurrentCli, metricConcurrentSelf, c.floorConns()),
		Runs: fmt.Sprintf("%d per scenario and system, systems interleaved in rotating order", c.runs),
	}
	if c.shapes {
		s.Shapes = fmt.Sprintf("each shape's tasks (no-op shapes: %s) worked by in-process nodes of %d workers (River: a queue per behavior, MaxWorkers its cap), submitted by a client on its own pool before the nodes start (backlog) or every 10 ms at the ideal rate (streaming); until the last run returned; \"÷ limit\": over the ideal, the throughput the shape's limits allow, where below %s/s",
			num(int64(c.shapesN)), c.shapeWorkers(), num(maxIdeal))
	}
	s.LimitsCost, s.GlobalCap, s.Rate, s.Fair = c.flowSummary()
	if c.sig.on {
		s.Signals = c.sig.summary()
	}
	return s
}

// computeRatios fills PerSec and the stint ratios.
func (r *Report) computeRatios() {
	key := func(x Result) string { return fmt.Sprintf("%s|%s|%d", x.Scenario, x.Metric, x.Nodes) }
	stint := map[string]Result{}
	for i := range r.Results {
		x := &r.Results[i]
		if x.Seconds > 0 {
			x.PerSec = float64(x.Tasks) / x.Seconds
		}
		// The first stint row of a metric is stint at its defaults, the
		// peers' like: a later one (the server's own submits) is a
		// variant of it.
		if _, seen := stint[key(*x)]; !seen && x.Error == "" && strings.HasPrefix(x.System, sysStint) {
			stint[key(*x)] = *x
		}
	}
	for i := range r.Results {
		x := &r.Results[i]
		s, ok := stint[key(*x)]
		if !ok || x.Error != "" || strings.HasPrefix(x.System, sysStint) {
			continue
		}
		switch {
		case x.Latency != nil && s.Latency != nil && x.Latency.P50MS > 0:
			x.StintRatio = s.Latency.P50MS / x.Latency.P50MS
			if x.Latency.P99MS > 0 {
				x.StintRatioP99 = s.Latency.P99MS / x.Latency.P99MS
			}
		case x.PerSec > 0:
			x.StintRatio = s.PerSec / x.PerSec
			x.StintRatioPerRun, x.StintRatioMin = runRatios(s.PerRun, x.PerRun)
		}
	}
	r.ScaleDBCPU = scaleCPU(r.Results)
	r.flowRatios()
}

// runRatios divides num by den run by run (the systems' i-th runs ran in
// the same round) and returns the ratios and the least of them; none
// unless both have the same runs, more than one.
func runRatios(num, den []float64) ([]float64, float64) {
	if len(den) <= 1 || len(num) != len(den) {
		return nil, 0
	}
	out := make([]float64, len(den))
	for i, v := range den {
		if v > 0 {
			out[i] = num[i] / v
		}
	}
	return out, slices.Min(out)
}

// ScaleCPU is PostgreSQL's CPU time per task with one node process and
// with the most the scale scenario ran, for one system.
type ScaleCPU struct {
	System string `json:"system"`
	// Nodes is the largest node count.
	Nodes int `json:"nodes"`
	// OneUS and NodesUS are the microseconds of PostgreSQL CPU time per
	// task with one node and with Nodes, over all runs.
	OneUS   float64 `json:"one_node_us_per_task"`
	NodesUS float64 `json:"nodes_us_per_task"`
	// Ratio is NodesUS over OneUS.
	Ratio float64 `json:"ratio"`
}

// scaleCPU compares each system's scale rows of the most nodes with its
// row of one node.
func scaleCPU(results []Result) []ScaleCPU {
	one := map[string]Result{}
	most := map[string]Result{}
	var order []string
	for _, x := range results {
		if x.Scenario != "scale" || x.Error != "" || x.DBUSPerTask <= 0 {
			continue
		}
		if x.Nodes == 1 {
			one[x.System] = x
			order = append(order, x.System)
		}
		if m, ok := most[x.System]; !ok || x.Nodes > m.Nodes {
			most[x.System] = x
		}
	}
	var out []ScaleCPU
	for _, sys := range order {
		o, m := one[sys], most[sys]
		if m.Nodes <= 1 {
			continue
		}
		out = append(out, ScaleCPU{System: sys, Nodes: m.Nodes, OneUS: o.DBUSPerTask, NodesUS: m.DBUSPerTask, Ratio: m.DBUSPerTask / o.DBUSPerTask})
	}
	return out
}

// failed reports whether a run failed.
func (r *Report) failed() bool {
	for _, x := range r.Results {
		if x.Error != "" {
			return true
		}
	}
	return false
}
