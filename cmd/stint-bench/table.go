package main

// The report printed for people: the table of rows, its legend, the SQL
// and CPU profiles, and the formatting of figures.

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// value renders a row's figure.
func (x Result) value() string {
	switch {
	case x.Error != "":
		return "ERROR: " + x.Error
	case x.Latency != nil || x.samples != nil:
		l := x.Latency
		if l == nil {
			l = summarize(x.samples)
		}
		return fmt.Sprintf("p50 %s  p99 %s  (max %s)", msStr(l.P50MS), msStr(l.P99MS), msStr(l.MaxMS))
	case x.Seconds > 0:
		return num(int64(math.Round(float64(x.Tasks)/x.Seconds))) + " tasks/s"
	}
	return "-"
}

func (x Result) scenarioLabel() string {
	if x.Nodes > 0 {
		if x.Nodes == 1 {
			return "scale 1 node"
		}
		return fmt.Sprintf("scale %d nodes", x.Nodes)
	}
	return x.Scenario
}

// writeTable prints the report for people.
func (r *Report) writeTable(w io.Writer) {
	p := r.Postgres
	fmt.Fprintf(w, "stint-bench, %s\n", r.Started.Format(time.RFC3339))
	fmt.Fprintf(w, "PostgreSQL %s: %s\n", p.Version, p.Source)
	fmt.Fprintf(w, "  fsync=%s synchronous_commit=%s full_page_writes=%s shared_buffers=%s max_connections=%s wal_level=%s; %d CPUs shared by everything\n",
		p.Fsync, p.SynchronousCommit, p.FullPageWrites, p.SharedBuffers, p.MaxConnections, p.WalLevel, p.CPUs)
	c := r.Config
	fmt.Fprintf(w, "stint:     %s\n", c.Stint)
	fmt.Fprintf(w, "River:     %s\n", c.River)
	fmt.Fprintf(w, "Graphile:  %s\n", c.Graphile)
	fmt.Fprintf(w, "DBOS:      %s\n", c.DBOS)
	fmt.Fprintf(w, "floor:     %s\n", c.Floor)
	fmt.Fprintf(w, "burn-down: %s\n", c.BurnDown)
	fmt.Fprintf(w, "streaming: %s\n", c.Streaming)
	fmt.Fprintf(w, "burst:     %s\n", c.Burst)
	fmt.Fprintf(w, "drain-burst: %s\n", c.DrainBurst)
	fmt.Fprintf(w, "latency:   %s\n", c.Latency)
	fmt.Fprintf(w, "scale:     %s\n", c.Scale)
	fmt.Fprintf(w, "concurrent submit: %s\n", c.Concurrent)
	if c.Signals != "" {
		fmt.Fprintf(w, "signals:   %s\n", c.Signals)
	}
	if c.Shapes != "" {
		fmt.Fprintf(w, "shapes:    %s\n", c.Shapes)
	}
	for _, f := range [][2]string{{"limits-cost", c.LimitsCost}, {"global-cap", c.GlobalCap}, {"rate", c.Rate}, {"fair", c.Fair}} {
		if f[1] != "" {
			fmt.Fprintf(w, "%s: %s\n", f[0], f[1])
		}
	}
	fmt.Fprintf(w, "runs:      %s\n\n", c.Runs)

	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tMETRIC\tSYSTEM\tTASKS\tSECONDS\tRESULT\tRUNS: SLOWEST–FASTEST (SLOWEST ÷ MEDIAN)\tCPU% BENCH/OTHERS/STEAL\tCPU µs/TASK GO/PG\tWAL B/TASK\tFSYNCS/COMMITS PER 1K\tSTINT ÷ THIS")
	last := ""
	for _, x := range r.Results {
		label := x.scenarioLabel()
		if last != "" && label != last {
			fmt.Fprintln(tw, "\t\t\t\t\t\t\t\t\t\t\t")
		}
		last = label
		tasks, secs := "", ""
		if x.Tasks > 0 {
			tasks = num(x.Tasks)
		}
		if x.Seconds > 0 {
			secs = strconv.FormatFloat(x.Seconds, 'f', 2, 64)
		}
		ratio := x.flowRatio()
		switch {
		case ratio != "" && x.StintRatio > 0:
			ratio += fmt.Sprintf("; stint ÷ this %.2f×", x.StintRatio)
		case ratio != "":
		case x.StintRatio > 0 && x.Latency != nil:
			ratio = fmt.Sprintf("p50 %.2f×  p99 %.2f×", x.StintRatio, x.StintRatioP99)
		case x.StintRatio > 0 && len(x.StintRatioPerRun) > 0:
			ratio = fmt.Sprintf("%.2f× (runs %.2f–%.2f×)", x.StintRatio, x.StintRatioMin, slices.Max(x.StintRatioPerRun))
		case x.StintRatio > 0:
			ratio = fmt.Sprintf("%.2f×", x.StintRatio)
		}
		spread := ""
		if len(x.PerRun) > 1 {
			spread = fmt.Sprintf("%d: %s–%s (%.2f×)", len(x.PerRun), num(int64(slices.Min(x.PerRun))), num(int64(slices.Max(x.PerRun))), x.SlowestOverMedian)
		} else if x.Runs > 1 {
			spread = fmt.Sprintf("%d: pooled", x.Runs)
		}
		steal := ""
		if x.Error == "" && x.CPU.Steal >= 0 {
			steal = fmt.Sprintf("%.0f / %.0f / %.0f", x.CPU.Ours, x.CPU.Others, x.CPU.Steal)
		}
		if n := max(x.Noisy, btoi(x.Runs == 0 && x.CPU.noisy())); n > 0 {
			steal += fmt.Sprintf(" NOISY %d/%d", n, max(x.Runs, 1))
		}
		perTask := ""
		// Latency rows leave it out: at a hundred tasks a second the
		// systems' idle upkeep is most of their CPU time.
		if x.Latency == nil && (x.GoUSPerTask > 0 || x.DBUSPerTask > 0) {
			perTask = fmt.Sprintf("%.1f / %.1f", x.GoUSPerTask, x.DBUSPerTask)
		}
		walPerTask := ""
		if x.Latency == nil && x.WALPerTask > 0 {
			walPerTask = num(int64(math.Round(x.WALPerTask)))
		}
		syncs := ""
		if x.Latency == nil && x.CommitsPerTask > 0 {
			syncs = fmt.Sprintf("%.1f / %.1f", 1000*x.SyncsPerTask, 1000*x.CommitsPerTask)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", label, x.Metric, x.System, tasks, secs, x.value(), spread, steal, perTask, walPerTask, syncs, ratio)
	}
	_ = tw.Flush()
	for _, line := range strings.Split(strings.TrimRight(table.String(), "\n"), "\n") {
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
	for _, sc := range r.ScaleDBCPU {
		fmt.Fprintf(w, "\nscale, PostgreSQL CPU per task, %d nodes ÷ 1 node, %s: %.1f ÷ %.1f µs = %.2f×", sc.Nodes, sc.System, sc.NodesUS, sc.OneUS, sc.Ratio)
	}
	if len(r.ScaleDBCPU) > 0 {
		fmt.Fprintln(w, " (the same work: what grows is the nodes' contention)")
	}
	fmt.Fprintln(w, "\nRESULT: the median run; RUNS: the number of runs, their slowest–fastest tasks/s and the slowest over the median (latency pools all runs' samples).")
	fmt.Fprintln(w, "CPU% BENCH/OTHERS/STEAL: how the machine's CPU time (all cores) went during the measured windows, mean over runs: to this")
	fmt.Fprintln(w, "  benchmark (harness, system, nodes, PostgreSQL) / to other processes on the machine / to other virtual machines.")
	fmt.Fprintln(w, "  BENCH well under 100 with OTHERS and STEAL low: the system waits rather than computes; high OTHERS or STEAL: noise.")
	fmt.Fprintf(w, "  NOISY n/m: in n of the m runs other processes and steal took more than %d%% of the CPU time; those figures are suspect.\n", noisyPct)
	fmt.Fprintln(w, "CPU µs/TASK GO/PG: CPU time per task over all runs of a throughput row: of the Go processes (the harness with the system it runs")
	fmt.Fprintln(w, "  in-process, or the harness and the node and client processes; Graphile Worker's Node.js processes) / of PostgreSQL (backends,")
	fmt.Fprintln(w, "  autovacuum, WAL writer, checkpointer).")
	fmt.Fprintln(w, "WAL B/TASK: the WAL the cluster wrote per task over all runs of a throughput row (pg_current_wal_insert_lsn at the windows'")
	fmt.Fprintln(w, "  starts and ends), full-page images after a checkpoint included.")
	fmt.Fprintln(w, "FSYNCS/COMMITS PER 1K: the WAL flushes to disk (pg_stat_wal) and the transactions committed (pg_stat_database) per 1,000 tasks,")
	fmt.Fprintln(w, "  all the cluster's; PostgreSQL publishes both up to a second late, so a short run's are approximate.")
	fmt.Fprintln(w, "STINT ÷ THIS: stint's tasks/s over this row's (above 1: stint is faster), the medians' and, in brackets, the least and most of the runs'")
	fmt.Fprintln(w, "  (the systems' i-th runs ran in the same round); for latency stint's p50 and p99 over this row's (below 1: stint is quicker).")
	fmt.Fprintln(w, "  Flow-control rows: \"÷ X\" is this row's tasks/s over row X's, the same work without the limit (or key); \"÷ limit\" over the rate limit.")
	r.writeChecks(w)

	for _, s := range r.SQL {
		fmt.Fprintf(w, "\nSQL profile, %s (%.2f s wall; pg_stat_statements, top by total execution time):\n", s.Run, s.WallSecs)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "calls\ttotal ms\tmean ms\tmax ms\trows\tblocks hit/call\t  query")
		for _, st := range s.Statements {
			q := st.Query
			if len(q) > 140 {
				q = q[:140] + "…"
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%.3f\t%.1f\t%s\t%.0f\t  %s\n", num(st.Calls), st.TotalMS, st.MeanMS, st.MaxMS, num(st.Rows),
				float64(st.BlocksHit)/float64(max(st.Calls, 1)), q)
		}
		_ = tw.Flush()
	}
	if len(r.Profiles) > 0 {
		fmt.Fprintf(w, "\nCPU profiles of stint runs (go tool pprof -top BINARY FILE):\n")
		for _, f := range r.Profiles {
			fmt.Fprintf(w, "  %s\n", f)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

func msStr(ms float64) string {
	switch {
	case ms >= 100:
		return fmt.Sprintf("%.0f ms", ms)
	case ms >= 10:
		return fmt.Sprintf("%.1f ms", ms)
	}
	return fmt.Sprintf("%.2f ms", ms)
}

// num formats n with thousands separators.
func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
