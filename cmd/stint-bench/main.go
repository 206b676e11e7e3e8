// Command stint-bench runs stint and its peers, River, Graphile Worker and
// DBOS Transact for Go, side by side against the same PostgreSQL and prints
// one table (or, with --json, one JSON document).
//
// By default it starts its own throwaway PostgreSQL cluster (pgcluster, with
// durable settings unless --fast is given) in a temporary directory; with
// --db it uses an existing server instead, whose user must be allowed to
// create databases. Every scenario and system gets a fresh database.
//
// River runs in-process (riverqueue/river). Graphile Worker (--systems
// ...,graphile) runs in Node.js processes: the npm package graphile-worker
// is installed with npm into the user's cache folder on first use, and runs
// tuned as its performance documentation says; where Node.js or npm is
// missing the benchmark says so and runs the others. DBOS Transact for Go
// (--systems ...,dbos) runs in Go processes of its own: its runner, the
// module in the directory dbos beside this file (DBOS's dependencies stay
// out of stint's go.mod), is built with the go command into the user's
// cache folder on first use; DBOS takes part in the burn-down, streaming,
// latency and signals scenarios (see dbos.go for its tuning).
//
// Scenarios (all run unless some are picked with their flags):
//
//	--burndown    N no-op tasks inserted first, then worked: insert and work rates
//	--streaming   inserts and work at the same time for D seconds: completed
//	              tasks/s, with the inserts from the harness's client (a pool of
//	              its own) and, in a second row, from a separate client process
//	--burst       a server node starts on an empty database and submits N tasks
//	              itself, in batches, as fast as it can, while it runs them: N
//	              over the time until the last one is stored finished
//	--drain-burst cycles of (queue empty, ANALYZE, a burst of N tasks from a
//	              client process) while the workers run: all the tasks over the
//	              cycles' time
//	--latency     single tasks at a steady low rate: submit->stored (the submit
//	              call returned), submit->start and, for stint, submit->awaited
//	              result: p50/p99, after a warm-up. stint's tasks are submitted
//	              through a separate impl.Client (as another process would) and
//	              through the server node itself, whose submits start their
//	              tasks at once (--latency-submit picks);
//	              --stint-no-local-start turns that off to compare
//	--scale       1, 2 and 4 server nodes as separate processes working a
//	              burn-down; the report compares PostgreSQL's CPU time per task
//	              of the most nodes with one's
//	--floor       the same database doing only batched insert, claim and complete
//	              statements on stint's tables (tasks, claim hints, leases): the floor
//	--shapes      (not run by default) the shape matrix: no-op, 10 ms and 100 ms
//	              runs under no cap, MaxConcurrency 8 and 64; a stream instead of
//	              a backlog; three nodes; four behaviors with their own caps and
//	              priorities; group keys under GroupConcurrency (stint only:
//	              River has no cap per key). Each row's throughput over its
//	              ideal, the throughput its limits allow ("÷ limit"), where
//	              that is below 20,000/s; River's queues get the caps as
//	              MaxWorkers (a per-node limit, as MaxConcurrency is)
//	--concurrent-submit
//	              --concurrent-n callers (10,000) released together, each
//	              submitting one task, while the workers run (a web service
//	              enqueuing one task per request): submits/s from the release
//	              until the last call returned. stint and River each from a
//	              client on a pool of its own (stint's impl.Client, River's
//	              insert-only client with Insert) and from the working process
//	              itself (stint's server node, River's working client); the
//	              floor row is as many connections as stint's pool (20, or
//	              --stint-max-conns) inserting a row per durable statement,
//	              as pgbench's clients do
//
// The workflow scenario runs only when picked (--workflows): graphs of
// no-op tasks as stint workflows and as pg-boss flows (--systems
// stint,pgboss), each submitted by the working process on a fresh
// database: a fan-out 1 -> N (with N plain stint tasks beside it), a
// fan-in N -> 1, layers each depending on two nodes of the layer before,
// and a chain, whose hops (a node's finish to the next one's start) are
// the latency rows: stint's measured in the working process, from a
// node's run to the next one's (the database's times of a node started in
// its dependency's finish are that transaction's), pg-boss's on the
// database's clock, from a job's completion to the next one's fetch.
//
// The durable-wait scenarios run only when picked (--signals): signals to
// tasks asleep on them, one at a time and to 10,000 at once, and events
// awaited as a running task sets them, stint against DBOS (see signals.go).
//
// The flow-control scenarios are stint's alone, each run with and without
// what it measures, and run only when picked:
//
//	--limits-cost a burn-down of no-op tasks under a rate limit and a cluster
//	              cap set too high to bind, against the same without them
//	--global-cap  node processes of few workers each working 100 ms tasks
//	              under a cluster cap of all their workers, against no cap
//	--rate        a backlog worked under a rate limit: the rate achieved
//	              after the first period, and the most starts in any second
//	              against the rule's bound
//	--fair        one group key's backlog worked with fair share while
//	              another key submits a few tasks a second: the second key's
//	              submit->start, and the first key's throughput against its
//	              own alone
//
// Each scenario runs --runs times per system, the systems interleaved, and
// the table shows the median run, the slowest and fastest (and the slowest
// over the median), and stint's ratio to each peer, of the medians and run
// by run; latency pools the samples of all runs. Throughput is the rate of
// the whole measured run: burst and drain-burst leave no warm-up out. The CPU column splits the machine's CPU time during the
// measured window (from /proc): the benchmark's own process tree (itself,
// its node processes, its PostgreSQL), other processes, and time stolen by
// the hypervisor. On a shared machine the last two explain much of the
// spread between runs; a low first one means the system under test waits
// rather than computes.
//
// Profiles: --cpuprofile PREFIX writes one pprof CPU profile per stint run
// (PREFIX-<run>.pprof, node processes included); --sqlprofile records
// pg_stat_statements per run and prints the statements that took the most time.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// config is what the flags set.
type config struct {
	dbURL   string
	fast    bool
	dataDir string
	json    bool
	verbose bool

	burndown, streaming, burst, drainBurst, latency, scale, floor, concurrent bool
	shapes                                                                    bool
	shapesN                                                                   int
	shapesMatch                                                               string
	systems                                                                   string

	n             int
	batch         int
	streamDur     time.Duration
	streamWarmup  time.Duration
	streamBatch   int
	streamBacklog int
	latRate       int
	latDur        time.Duration
	latWarmup     time.Duration
	latNoAwait    bool
	latSubmit     string
	burstN        int
	concurrentN   int
	burstBatch    int
	drainCycles   int
	scaleN        int
	scaleNodes    []int
	floorN        int
	floorWorkers  int
	floorClaim    int
	pollEvery     time.Duration
	timeout       time.Duration
	runs          int

	stintWorkers  int
	stintMaxConns int
	stintPoll     time.Duration
	stintCooldown time.Duration
	stintClaims   int
	stintNoLocal  bool

	riverWorkers  int
	riverMaxConns int
	riverCooldown time.Duration
	riverPoll     time.Duration

	graphileProcs int
	dbos          dbosConfig

	sig      signalsConfig
	flow     flowConfig
	wf       workflowConfig
	flowNode bool // a node process registers the flow-control behaviors

	cpuprofile string
	sqlprofile bool
}

// defaultConfig returns the configuration with every flag at its default.
func defaultConfig() config {
	return config{
		n:             100_000,
		batch:         5_000,
		streamDur:     10 * time.Second,
		streamWarmup:  time.Second,
		streamBatch:   1_000,
		streamBacklog: 20_000,
		latRate:       100,
		latDur:        5 * time.Second,
		latWarmup:     time.Second,
		latSubmit:     "client,server",
		burstN:        100_000,
		concurrentN:   10_000,
		burstBatch:    5_000,
		drainCycles:   3,
		scaleN:        100_000,
		scaleNodes:    []int{1, 2, 4},
		floorN:        100_000,
		floorWorkers:  4,
		floorClaim:    1_000,
		pollEvery:     10 * time.Millisecond,
		timeout:       10 * time.Minute,
		runs:          3,
		systems:       "stint,river,floor",
		riverWorkers:  1_000,
		shapesN:       20_000,
		riverCooldown: time.Millisecond,
		riverPoll:     20 * time.Millisecond,
		graphileProcs: 2,
		dbos:          defaultDBOSConfig(),
		sig:           defaultSignalsConfig(),
		flow:          defaultFlowConfig(),
	}
}

// parseFlags parses args into a config.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	c := defaultConfig()
	fs := flag.NewFlagSet("stint-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: stint-bench [flags]\n\nRuns stint, River, Graphile Worker and DBOS side by side on one PostgreSQL; see the package documentation.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&c.dbURL, "db", "", "`URL` of an existing PostgreSQL server (maintenance database) to create the benchmark databases on; default: start a throwaway cluster")
	fs.BoolVar(&c.fast, "fast", false, "start the throwaway cluster with fsync, synchronous_commit and full_page_writes off (default: durable)")
	fs.StringVar(&c.dataDir, "datadir", os.TempDir(), "`directory` to create the throwaway cluster's data directory in")
	fs.BoolVar(&c.json, "json", false, "print the report as JSON instead of a table")
	fs.BoolVar(&c.verbose, "v", false, "log progress and the systems' warnings to stderr")

	fs.BoolVar(&c.burndown, "burndown", false, "run the burn-down scenario")
	fs.BoolVar(&c.streaming, "streaming", false, "run the streaming scenario, with the submits from the harness's own client and from a separate client process")
	fs.BoolVar(&c.burst, "burst", false, "run the burst scenario")
	fs.BoolVar(&c.drainBurst, "drain-burst", false, "run the drain-burst scenario")
	fs.BoolVar(&c.latency, "latency", false, "run the latency scenario")
	fs.BoolVar(&c.scale, "scale", false, "run the multi-process scale scenario")
	fs.BoolVar(&c.floor, "floor", false, "run the SQL floor")
	fs.BoolVar(&c.concurrent, "concurrent-submit", false, "run the concurrent-submit scenario: many callers each submitting one task")
	fs.BoolVar(&c.shapes, "shapes", false, "run the shape matrix: run durations, per-node caps, several behaviors, group keys, backlog or stream, one node or three, each against its ideal (not run by default)")
	fs.StringVar(&c.shapesMatch, "shapes-match", "", "shapes: run only the shapes whose name contains this `text` (as the table names them)")
	fs.IntVar(&c.shapesN, "shapes-n", c.shapesN, "shapes: tasks of a no-op shape (the others are sized to take about two seconds at their ideal)")
	fs.IntVar(&c.concurrentN, "concurrent-n", c.concurrentN, "concurrent-submit: callers, each submitting one task")
	fs.StringVar(&c.systems, "systems", c.systems, "comma-separated `systems` to run: stint, river, graphile (Graphile Worker: needs Node.js and npm, installs itself on first use), floor, pgboss (pg-boss, the workflow scenario's peer: needs Node.js and npm, installs itself on first use), dbos (DBOS Transact for Go: needs the go command, builds its runner on first use)")

	fs.IntVar(&c.n, "n", c.n, "burn-down: number of tasks")
	fs.IntVar(&c.batch, "batch", c.batch, "burn-down, scale and floor: tasks per insert statement")
	fs.DurationVar(&c.streamDur, "duration", c.streamDur, "streaming: length of the measured window")
	fs.DurationVar(&c.streamWarmup, "warmup", c.streamWarmup, "streaming: time working before the window starts")
	fs.IntVar(&c.streamBatch, "stream-batch", c.streamBatch, "streaming: tasks per insert statement")
	fs.IntVar(&c.streamBacklog, "stream-backlog", c.streamBacklog, "streaming: the inserter keeps at most this many tasks inserted but not started")
	fs.IntVar(&c.latRate, "latency-rate", c.latRate, "latency: tasks submitted per second")
	fs.DurationVar(&c.latDur, "latency-duration", c.latDur, "latency: how long to submit, after the warm-up")
	fs.DurationVar(&c.latWarmup, "latency-warmup", c.latWarmup, "latency: how long to submit before the measured window (the pools' connections are opened and warmed then); 0 measures from a cold start")
	fs.BoolVar(&c.latNoAwait, "latency-no-await", false, "latency: stint submits without awaiting (a diagnostic: shows what Await costs submit->start)")
	fs.StringVar(&c.latSubmit, "latency-submit", c.latSubmit, "latency: comma-separated `submitters` of stint's tasks, each a row: client (an impl.Client on a pool of its own, as another process), server (the server node itself: its submits start their tasks at once on it)")
	fs.BoolVar(&c.stintNoLocal, "stint-no-local-start", false, "stint: turn off the server's local start of the tasks it submits (ServerConfig.NoLocalStart), at defaults too")
	fs.IntVar(&c.burstN, "burst-n", c.burstN, "burst and drain-burst: tasks per burst")
	fs.IntVar(&c.burstBatch, "burst-batch", c.burstBatch, "burst and drain-burst: tasks per submit call")
	fs.IntVar(&c.drainCycles, "drain-cycles", c.drainCycles, "drain-burst: cycles of (queue empty, ANALYZE, burst)")
	fs.IntVar(&c.scaleN, "scale-n", c.scaleN, "scale: number of tasks per run")
	scaleNodes := fs.String("scale-nodes", "1,2,4", "scale: comma-separated `counts` of node processes")
	fs.IntVar(&c.floorN, "floor-n", c.floorN, "floor: number of tasks")
	fs.IntVar(&c.floorWorkers, "floor-workers", c.floorWorkers, "floor: goroutines claiming and completing")
	fs.IntVar(&c.floorClaim, "floor-claim", c.floorClaim, "floor: tasks per claim statement")
	fs.DurationVar(&c.pollEvery, "poll", c.pollEvery, "how often the harness checks whether all tasks are done")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "limit for one scenario run of one system")
	fs.IntVar(&c.runs, "runs", c.runs, "runs of each scenario and system, interleaved; the table shows the median (latency: all samples pooled)")

	c.addSystemFlags(fs)
	c.flow.addFlags(fs)
	c.wf.addFlags(fs)
	c.sig.addFlags(fs)
	c.dbos.addFlags(fs)
	fs.BoolVar(&c.sqlprofile, "sqlprofile", false, "record pg_stat_statements per run and print the costliest statements (restarts the throwaway cluster with the extension loaded)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if !c.burndown && !c.streaming && !c.burst && !c.drainBurst && !c.latency && !c.scale && !c.floor && !c.concurrent && !c.shapes && !c.flow.picked() && !c.wf.on && !c.sig.on {
		c.burndown, c.streaming, c.burst, c.drainBurst, c.latency, c.scale, c.floor, c.concurrent = true, true, true, true, true, true, true, true
	}
	nodes, err := parseInts(*scaleNodes)
	if err != nil {
		return c, fmt.Errorf("--scale-nodes: %w", err)
	}
	c.scaleNodes = nodes
	for _, s := range splitList(c.systems) {
		if s != sysStint && s != sysRiver && s != sysGraphile && s != sysFloor && s != sysPgBoss && s != sysDBOS {
			return c, fmt.Errorf("--systems: unknown system %q (want stint, river, graphile, floor, pgboss or dbos)", s)
		}
	}
	for name, v := range map[string]int{"n": c.n, "batch": c.batch, "stream-batch": c.streamBatch, "stream-backlog": c.streamBacklog,
		"latency-rate": c.latRate, "scale-n": c.scaleN, "floor-n": c.floorN, "floor-workers": c.floorWorkers, "floor-claim": c.floorClaim, "river-workers": c.riverWorkers, "runs": c.runs,
		"burst-n": c.burstN, "concurrent-n": c.concurrentN, "shapes-n": c.shapesN, "burst-batch": c.burstBatch, "drain-cycles": c.drainCycles, "graphile-processes": c.graphileProcs} {
		if v <= 0 {
			return c, fmt.Errorf("--%s must be positive, not %d", name, v)
		}
	}
	for _, s := range splitList(c.latSubmit) {
		if s != "client" && s != "server" {
			return c, fmt.Errorf("--latency-submit: unknown submitter %q (want client or server)", s)
		}
	}
	if c.latWarmup < 0 {
		return c, fmt.Errorf("--latency-warmup must not be negative, not %s", c.latWarmup)
	}
	if err := c.flow.check(c.has(sysStint)); err != nil {
		return c, err
	}
	if err := c.wf.check(); err != nil {
		return c, err
	}
	if err := c.sig.check(); err != nil {
		return c, err
	}
	if c.sig.on && !c.has(sysStint) {
		return c, errors.New("--signals measures stint's signals: --systems must include stint")
	}
	if c.dbos.concurrency <= 0 || c.dbos.poll <= 0 || c.dbos.coalesce < time.Millisecond {
		return c, errors.New("--dbos-concurrency and --dbos-poll must be positive, --dbos-coalesce at least 1ms (DBOS's minimum)")
	}
	if c.wf.on && !c.has(sysStint) {
		return c, errors.New("--workflows measures stint's workflows: --systems must include stint")
	}
	return c, nil
}

// has reports whether system is among those to run.
func (c *config) has(system string) bool {
	for _, s := range splitList(c.systems) {
		if s == system {
			return true
		}
	}
	return false
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("no counts given")
	}
	return out, nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == nodeCommand {
		os.Exit(nodeMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == clientCommand {
		os.Exit(clientMain(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the exit, for the benchmark itself.
func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "stint-bench:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	logLevel := slog.LevelError
	if cfg.verbose {
		logLevel = slog.LevelWarn
	}
	b := &bench{cfg: cfg, log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: logLevel})), warn: stderr}
	if cfg.verbose {
		b.progress = stderr
	}
	srv, err := openServer(ctx, cfg, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "stint-bench:", err)
		return 1
	}
	defer srv.close()
	b.db = srv
	defer openWALMeter(ctx, srv.admin)()

	rep, err := b.run(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "stint-bench:", err)
		return 1
	}
	if cfg.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintln(stderr, "stint-bench: write JSON:", err)
			return 1
		}
	} else {
		rep.writeTable(stdout)
	}
	if rep.failed() {
		return 1
	}
	return 0
}

// addSystemFlags adds the flags that tune the systems under test (and the
// CPU profile), which the scale scenario passes on to its node processes.
func (c *config) addSystemFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.stintWorkers, "stint-workers", 0, "stint ServerConfig.MaxWorkers (0: stint's default)")
	fs.IntVar(&c.stintMaxConns, "stint-max-conns", 0, "stint store pool size (0: stint's default)")
	fs.DurationVar(&c.stintPoll, "stint-poll", 0, "stint ServerConfig.PollInterval (0: stint's default)")
	fs.DurationVar(&c.stintCooldown, "stint-fetch-cooldown", 0, "stint ServerConfig.FetchCooldown (0: stint's default)")
	fs.IntVar(&c.stintClaims, "stint-claim-concurrency", 0, "stint ServerConfig.ClaimConcurrency (0: stint's default)")

	fs.IntVar(&c.riverWorkers, "river-workers", c.riverWorkers, "River MaxWorkers of the default queue")
	fs.IntVar(&c.riverMaxConns, "river-max-conns", 0, "River pool size (0: pgxpool's default, as River's own benchmark)")
	fs.DurationVar(&c.riverCooldown, "river-fetch-cooldown", c.riverCooldown, "River FetchCooldown (tuned runs)")
	fs.DurationVar(&c.riverPoll, "river-fetch-poll", c.riverPoll, "River FetchPollInterval (tuned runs)")

	fs.IntVar(&c.graphileProcs, "graphile-processes", c.graphileProcs, "Graphile Worker worker processes (its performance documentation: 2 on a 2-core machine); scale runs its own counts")

	fs.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile of each stint run to `PREFIX`-<run>.pprof")
}
