package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"
)

// nodeCommand is the hidden subcommand that runs one worker node for the
// scale scenario: `stint-bench node --system stint|river --dsn DSN ...`. It
// builds the worker, prints "ready", starts working when it reads "go" on
// stdin, and stops when stdin closes.
const nodeCommand = "node"

// envNode marks a child process (a node or a client), so that a test binary
// re-executed as one runs it instead of the tests.
const envNode = "STINT_BENCH_NODE"

// scaleRun inserts cfg.scaleN tasks, then k node processes of system work
// them: tasks/s from "go" to none left.
func (b *bench) scaleRun(ctx context.Context, system string, k int) ([]Result, error) {
	dsn, err := b.db.newDB(ctx, fmt.Sprintf("scale%d_%s", k, system))
	if err != nil {
		return nil, err
	}
	if system == sysGraphile {
		return b.scaleGraphile(ctx, dsn, k)
	}
	var h harness
	switch system {
	case sysStint:
		h, err = newStint(ctx, dsn, b.cfg, b.log, stintOptions{client: true})
	default:
		h, err = newRiver(ctx, dsn, b.cfg, b.log, riverOptions{inserter: true})
	}
	if err != nil {
		return nil, err
	}
	defer h.close()
	n := b.cfg.scaleN
	if _, err := insertAll(ctx, h, n, b.cfg.batch); err != nil {
		return nil, err
	}

	secs, cpu, _, err := b.workNodes(ctx, h, dsn, fmt.Sprintf("%s scale %d nodes", system, k), k, n, func(i int) []string {
		var args []string
		if b.cfg.cpuprofile != "" && system == sysStint {
			path := fmt.Sprintf("%s-scale%d-node%d.pprof", b.cfg.cpuprofile, k, i+1)
			args = append(args, "--cpuprofile", path)
			b.rep.Profiles = append(b.rep.Profiles, path)
		}
		return append(args, b.nodeArgs(system, dsn, fmt.Sprintf("bench-node-%d", i+1))...)
	})
	if err != nil {
		return nil, err
	}
	return []Result{{Scenario: "scale", Metric: "work", System: system, Nodes: k, Tasks: int64(n), Seconds: secs, CPU: cpu}}, nil
}

// workNodes starts k node processes, the i-th with the arguments args(i),
// has them work until none of h's tasks is left, stops them and checks
// that n tasks completed. It returns the seconds from their "go" until
// none was left, the CPU usage meanwhile and the runs' spans the nodes
// reported; run names it in the SQL profile.
func (b *bench) workNodes(ctx context.Context, h harness, dsn, run string, k, n int, args func(i int) []string) (float64, usage, []span, error) {
	nodes := make([]*child, 0, k)
	defer func() {
		for _, p := range nodes {
			p.kill()
		}
	}()
	for i := range k {
		p, err := startSelf(ctx, nodeCommand, args(i))
		if err != nil {
			return 0, usage{}, nil, err
		}
		nodes = append(nodes, p)
	}
	b.resetStatements(ctx)
	win := begin()
	start := win.start
	for _, p := range nodes {
		if err := p.start(); err != nil {
			return 0, usage{}, nil, err
		}
	}
	end, err := waitDrained(ctx, h.observer(), h.queries(), b.cfg.pollEvery)
	cpu := win.usage()
	b.collectStatements(ctx, run, dsn, end.Sub(start))
	var stopErrs []error
	var spans []span
	for _, p := range nodes {
		stopErrs = append(stopErrs, p.stop(time.Minute))
		spans = append(spans, p.spans...)
	}
	nodes = nil
	if err != nil {
		return 0, usage{}, nil, err
	}
	if err := errors.Join(stopErrs...); err != nil {
		return 0, usage{}, nil, err
	}
	if err := checkCompleted(ctx, h.observer(), h.queries().completed, int64(n)); err != nil {
		return 0, usage{}, nil, err
	}
	return end.Sub(start).Seconds(), cpu, spans, nil
}

// scaleGraphile is scaleRun for Graphile Worker, whose worker processes
// are its harness's own.
func (b *bench) scaleGraphile(ctx context.Context, dsn string, k int) ([]Result, error) {
	h, err := newGraphile(ctx, b.graphile, dsn, k)
	if err != nil {
		return nil, err
	}
	defer h.close()
	n := b.cfg.scaleN
	if _, err := insertAll(ctx, h, n, b.cfg.batch); err != nil {
		return nil, err
	}
	secs, cpu, err := b.workAll(ctx, h, sysGraphile, dsn, fmt.Sprintf("scale %d nodes", k), n, nil)
	if err != nil {
		return nil, err
	}
	return []Result{{Scenario: "scale", Metric: "work", System: sysGraphile, Nodes: k, Tasks: int64(n), Seconds: secs, CPU: cpu}}, nil
}

// nodeArgs are the arguments of a node process.
func (b *bench) nodeArgs(system, dsn, name string) []string {
	return append(b.childArgs(system, dsn), "--name", name)
}

// childArgs are the arguments of a node or client process.
func (b *bench) childArgs(system, dsn string) []string {
	c := b.cfg
	return []string{
		"--system", system, "--dsn", dsn,
		"--stint-workers", strconv.Itoa(c.stintWorkers),
		"--stint-max-conns", strconv.Itoa(c.stintMaxConns),
		"--stint-poll", c.stintPoll.String(),
		"--stint-fetch-cooldown", c.stintCooldown.String(),
		"--stint-claim-concurrency", strconv.Itoa(c.stintClaims),
		"--river-workers", strconv.Itoa(c.riverWorkers),
		"--river-max-conns", strconv.Itoa(c.riverMaxConns),
		"--river-fetch-cooldown", c.riverCooldown.String(),
		"--river-fetch-poll", c.riverPoll.String(),
		"--v=" + strconv.FormatBool(c.verbose),
	}
}

// nodeMain runs a node process; see nodeCommand.
func nodeMain(args []string) int {
	var name string
	cfg, system, dsn, err := parseChildFlags(nodeCommand, args, func(fs *flag.FlagSet) { fs.StringVar(&name, "name", "", "node name") })
	if err != nil {
		return 2
	}
	if err := runNode(cfg, system, dsn, name); err != nil {
		fmt.Fprintf(os.Stderr, "stint-bench node %s: %v\n", name, err)
		return 1
	}
	return 0
}

func runNode(cfg config, system, dsn, name string) error {
	ctx := context.Background()
	log := childLogger(cfg.verbose)
	var h harness
	var err error
	switch system {
	case sysStint:
		h, err = newStint(ctx, dsn, cfg, log, stintOptions{server: true, node: name, flow: cfg.flowNode})
	case sysRiver:
		h, err = newRiver(ctx, dsn, cfg, log, riverOptions{worker: true})
	default:
		err = fmt.Errorf("unknown system %q", system)
	}
	if err != nil {
		return err
	}
	defer h.close()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "go" {
		return nil // stopped before it started
	}
	stopProf := func() {}
	if cfg.cpuprofile != "" {
		if stopProf, err = startCPUProfile(cfg.cpuprofile); err != nil {
			return err
		}
	}
	if err := h.start(ctx); err != nil {
		stopProf()
		return err
	}
	for in.Scan() {
	}
	stopProf()
	if err := h.stop(ctx); err != nil {
		return err
	}
	if sh, ok := h.(*stintHarness); ok && sh.flow != nil {
		return sh.flow.writeSpans(os.Stdout)
	}
	return nil
}
