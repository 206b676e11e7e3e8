package main

// The workflow scenario: graphs of no-op tasks in stint and in pg-boss
// (its flow(), jobs with dependsOn), run only when picked. Each run
// starts the workers on a fresh database, submits one graph (or, for the
// diamonds, many small ones from concurrent callers) and waits until
// every node ended: nodes per second from the first submit's start, the
// submit's own time, and along a chain the time from a node's finish to
// its dependent's start, both read from the database's clock.

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
)

// sysPgBoss names pg-boss, the peer of the workflow scenario.
const sysPgBoss = "pgboss"

// sysPlain is the row of stint's plain tasks that the fan-out is
// measured against; its name does not begin with stint's, so that the
// report divides stint's workflow by it as by a peer.
const sysPlain = "plain tasks (stint)"

// pgbossVersion is the pg-boss release the benchmark installs: the first
// line with flow() and dependsOn.
const pgbossVersion = "12.38.0"

//go:embed pgboss_runner.mjs
var pgbossRunner []byte

// The shapes of the workflow scenario.
const (
	shapeFanOut  = "fanout"
	shapeFanIn   = "fanin"
	shapeLayered = "layered"
	shapeChain   = "chain"
	// shapeDiamonds is many small workflows, each a diamond of 4 nodes
	// (a -> b, a -> c, {b, c} -> d), submitted by concurrent callers.
	shapeDiamonds = "diamonds"
)

// workflowConfig is what the workflow scenario's flags set.
type workflowConfig struct {
	on        bool
	shapes    string
	n         int // fan-out and fan-in: the wide side
	layers    int // layered: layers
	width     int // layered: nodes per layer
	chain     int // chain: nodes
	peerChain int // chain: pg-boss's nodes (0: chain)
	diamonds  int // diamonds: workflows
	callers   int // diamonds: concurrent callers submitting them
}

// addFlags adds the workflow scenario's flags.
func (w *workflowConfig) addFlags(fs *flag.FlagSet) {
	fs.BoolVar(&w.on, "workflows", false, "run the workflow scenario: stint's workflows against pg-boss's flow() (with --systems including pgboss: needs Node.js and npm, installs itself on first use); not run by default")
	fs.StringVar(&w.shapes, "workflows-shapes", "fanout,fanin,layered,chain", "workflows: comma-separated `shapes`: fanout (1 -> N, with stint's N plain tasks beside), fanin (N -> 1), layered, chain, diamonds (many workflows of 4 nodes from concurrent callers; not run by default)")
	fs.IntVar(&w.n, "workflows-n", 10_000, "workflows: the wide side of fanout and fanin")
	fs.IntVar(&w.layers, "workflows-layers", 100, "workflows: layers of the layered shape, each node depending on 2 of the layer before")
	fs.IntVar(&w.width, "workflows-width", 100, "workflows: nodes per layer of the layered shape")
	fs.IntVar(&w.chain, "workflows-chain", 1_000, "workflows: nodes of the chain")
	fs.IntVar(&w.peerChain, "workflows-peer-chain", 0, "workflows: nodes of pg-boss's chain (0: --workflows-chain); its dependents are released by a loop of at least a second per hop")
	fs.IntVar(&w.diamonds, "workflows-diamonds", 1_000, "workflows: workflows of the diamonds shape, each of 4 nodes (a -> b, a -> c, {b,c} -> d)")
	fs.IntVar(&w.callers, "workflows-callers", 20, "workflows: concurrent callers submitting the diamonds, each one workflow at a time")
}

// check validates the flags.
func (w *workflowConfig) check() error {
	for name, v := range map[string]int{"workflows-n": w.n, "workflows-layers": w.layers, "workflows-width": w.width, "workflows-chain": w.chain} {
		if v <= 1 {
			return fmt.Errorf("--%s must be more than 1, not %d", name, v)
		}
	}
	if w.width < 2 {
		return fmt.Errorf("--workflows-width must be at least 2, not %d", w.width)
	}
	for name, v := range map[string]int{"workflows-diamonds": w.diamonds, "workflows-callers": w.callers} {
		if v < 1 {
			return fmt.Errorf("--%s must be at least 1, not %d", name, v)
		}
	}
	if w.peerChain < 0 || w.peerChain == 1 {
		return fmt.Errorf("--workflows-peer-chain must be 0 or more than 1, not %d", w.peerChain)
	}
	for _, s := range splitList(w.shapes) {
		switch s {
		case shapeFanOut, shapeFanIn, shapeLayered, shapeChain, shapeDiamonds:
		default:
			return fmt.Errorf("--workflows-shapes: unknown shape %q (want fanout, fanin, layered, chain or diamonds)", s)
		}
	}
	return nil
}

// scenario names a shape's rows.
func (w *workflowConfig) scenario(shape string) string {
	switch shape {
	case shapeFanOut:
		return fmt.Sprintf("workflow fan-out 1->%d", w.n)
	case shapeFanIn:
		return fmt.Sprintf("workflow fan-in %d->1", w.n)
	case shapeLayered:
		return fmt.Sprintf("workflow layered %dx%d", w.layers, w.width)
	case shapeDiamonds:
		return fmt.Sprintf("workflows %d diamonds of 4, %d callers", w.diamonds, w.callers)
	}
	return fmt.Sprintf("workflow chain %d", w.chain)
}

// nodes returns the nodes of shape as names and their dependencies' names,
// chain being the length of a chain; of the diamonds, those of one
// workflow.
func (w *workflowConfig) nodes(shape string, chain int) (names []string, deps [][]string) {
	add := func(name string, d ...string) { names, deps = append(names, name), append(deps, d) }
	switch shape {
	case shapeFanOut:
		add("root")
		for i := range w.n {
			add(fmt.Sprintf("n%05d", i), "root")
		}
	case shapeFanIn:
		all := make([]string, w.n)
		for i := range w.n {
			all[i] = fmt.Sprintf("n%05d", i)
			add(all[i])
		}
		add("sink", all...)
	case shapeLayered:
		name := func(l, k int) string { return fmt.Sprintf("l%03d-%03d", l, k) }
		for l := range w.layers {
			for k := range w.width {
				if l == 0 {
					add(name(l, k))
				} else {
					add(name(l, k), name(l-1, k), name(l-1, (k+1)%w.width))
				}
			}
		}
	case shapeDiamonds:
		add("a")
		add("b", "a")
		add("c", "a")
		add("d", "b", "c")
	case shapeChain:
		add("c00000")
		for i := 1; i < chain; i++ {
			add(fmt.Sprintf("c%05d", i), fmt.Sprintf("c%05d", i-1))
		}
	}
	return names, deps
}

// pgbossArgs is the flow command of shape for the pg-boss runner, and
// how many jobs it makes.
func (w *workflowConfig) pgbossArgs(shape string) (string, int) {
	switch shape {
	case shapeDiamonds:
		return fmt.Sprintf("flow diamonds %d %d", w.diamonds, w.callers), 4 * w.diamonds
	case shapeFanOut:
		return fmt.Sprintf("flow fanout %d", w.n), w.n + 1
	case shapeFanIn:
		return fmt.Sprintf("flow fanin %d", w.n), w.n + 1
	case shapeLayered:
		return fmt.Sprintf("flow layered %d %d", w.layers, w.width), w.layers * w.width
	}
	n := w.chain
	if w.peerChain > 0 {
		n = w.peerChain
	}
	return fmt.Sprintf("flow chain %d", n), n
}

// workflowJobs returns the jobs of the workflow scenario, a list per shape
// whose runs are interleaved.
func (b *bench) workflowJobs(ctx context.Context) [][]job {
	w := b.cfg.wf
	var boss *npmInstall
	if b.cfg.has(sysPgBoss) {
		var err error
		if boss, err = installNPM(ctx, b.logf, "pg-boss", "pg-boss", pgbossVersion, pgbossRunner, ".mjs"); err != nil {
			b.rep.Notes = append(b.rep.Notes, "pg-boss not run: "+err.Error())
		} else if out, err := exec.CommandContext(ctx, boss.node, "--version").Output(); err == nil {
			b.rep.Notes = append(b.rep.Notes, fmt.Sprintf("pg-boss %s on Node.js %s (pg-boss declares Node.js >= 22.12)", pgbossVersion, strings.TrimSpace(string(out))))
		}
	}
	var out [][]job
	for _, shape := range splitList(w.shapes) {
		scenario := w.scenario(shape)
		jobs := []job{{scenario, sysStint, func(ctx context.Context) ([]Result, error) { return b.workflowStint(ctx, shape) }}}
		if shape == shapeFanOut {
			jobs = append(jobs, job{scenario, sysPlain, b.plainStint})
		}
		if boss != nil {
			jobs = append(jobs, job{scenario, sysPgBoss, func(ctx context.Context) ([]Result, error) { return b.workflowPgBoss(ctx, boss, shape) }})
		}
		out = append(out, jobs)
	}
	return out
}

// workflowStint runs one graph of shape on a stint server: the server
// works, and submits the workflow itself.
func (b *bench) workflowStint(ctx context.Context, shape string) ([]Result, error) {
	if shape == shapeDiamonds {
		return b.diamondsStint(ctx)
	}
	w := b.cfg.wf
	names, deps := w.nodes(shape, w.chain)
	req := api.WorkflowRequest{ID: api.TaskID("bench-" + shape), Nodes: make([]api.WorkflowNode, len(names))}
	for i, name := range names {
		req.Nodes[i] = api.WorkflowNode{Name: name, DependsOn: deps[i], Task: api.SubmitRequest{Behavior: noopKind.ID}}
	}
	h, stop, err := b.stintServer(ctx, "wf_"+shape+"_stint", stintOptions{})
	if err != nil {
		return nil, err
	}
	defer stop()
	h.pr.arm()
	stopProf := b.profile(sysStint, "workflow-"+shape)
	b.resetStatements(ctx)
	win := begin()
	if _, err := h.srv.SubmitWorkflow(ctx, req); err != nil {
		stopProf()
		return nil, fmt.Errorf("stint submit workflow: %w", err)
	}
	submitted := time.Since(win.start)
	end, err := pollUntil(ctx, h.obs, b.cfg.pollEvery, `SELECT children_pending = 0 FROM stint_task WHERE id = $1`, string(req.ID))
	cpu := win.usage()
	stopProf()
	if err != nil {
		return nil, err
	}
	b.collectStatements(ctx, sysStint+" workflow "+shape, h.dsn, end.Sub(win.start))
	if err := checkCompleted(ctx, h.obs, `SELECT count(*) FROM stint_task WHERE parent_id = 'bench-`+shape+`' AND status = 'success'`, int64(len(names))); err != nil {
		return nil, err
	}
	res, err := b.workflowResults(ctx, shape, sysStint, len(names), submitted, end.Sub(win.start), cpu, nil, "")
	if err != nil || shape != shapeChain {
		return res, err
	}
	// A hop is measured in the process, from a node's run to the next
	// one's: the database's times would say when each was recorded
	// running, and a node started in its dependency's finish shares that
	// transaction's time (a hop of zero) while its run begins later.
	samples := make([]time.Duration, 0, len(names)-1)
	for i := 1; i < len(names); i++ {
		prev, ok1 := h.pr.startOf(string(req.ID) + "/" + names[i-1])
		next, ok2 := h.pr.startOf(string(req.ID) + "/" + names[i])
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("chain node %s or %s ran unseen", names[i-1], names[i])
		}
		samples = append(samples, next.Sub(prev))
	}
	return append(res, hopResult(b.cfg.wf.scenario(shape), sysStint, samples, cpu)), nil
}

// diamondsStint runs the diamonds on a stint server: --workflows-callers
// goroutines submit the workflows, each one at a time, while the server
// works them; measured from the first submit until every node ended.
func (b *bench) diamondsStint(ctx context.Context) ([]Result, error) {
	w := b.cfg.wf
	names, deps := w.nodes(shapeDiamonds, 0)
	reqs := make([]api.WorkflowRequest, w.diamonds)
	for i := range reqs {
		reqs[i] = api.WorkflowRequest{ID: api.TaskID(fmt.Sprintf("bench-d%06d", i)), Nodes: make([]api.WorkflowNode, len(names))}
		for j, name := range names {
			reqs[i].Nodes[j] = api.WorkflowNode{Name: name, DependsOn: deps[j], Task: api.SubmitRequest{Behavior: noopKind.ID}}
		}
	}
	h, stop, err := b.stintServer(ctx, "wf_"+shapeDiamonds+"_stint", stintOptions{})
	if err != nil {
		return nil, err
	}
	defer stop()
	stopProf := b.profile(sysStint, "workflow-"+shapeDiamonds)
	b.resetStatements(ctx)
	win := begin()
	err = inParallel(ctx, w.callers, len(reqs), func(ctx context.Context, i int) error {
		_, err := h.srv.SubmitWorkflow(ctx, reqs[i])
		return err
	})
	if err != nil {
		stopProf()
		return nil, fmt.Errorf("stint submit workflow: %w", err)
	}
	submitted := time.Since(win.start)
	nodes := len(names) * len(reqs)
	end, err := pollUntil(ctx, h.obs, b.cfg.pollEvery, `SELECT count(*) = $1 FROM stint_task WHERE workflow_node IS NOT NULL AND status = 'success'`, nodes)
	cpu := win.usage()
	stopProf()
	if err != nil {
		return nil, err
	}
	b.collectStatements(ctx, sysStint+" workflow "+shapeDiamonds, h.dsn, end.Sub(win.start))
	return b.workflowResults(ctx, shapeDiamonds, sysStint, nodes, submitted, end.Sub(win.start), cpu, nil, "")
}

// inParallel calls do with 0 to n-1 from callers goroutines, each taking
// the next index once it returned, and returns the first error (which
// stops the others taking more).
func inParallel(ctx context.Context, callers, n int, do func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n && ctx.Err() == nil; i = int(next.Add(1)) - 1 {
				if err := do(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && ctx.Err() != nil {
		return err
	}
	return nil
}

// hopResult is the row of a chain's hops, each from a node's finish to
// the next one's start.
func hopResult(scenario, system string, samples []time.Duration, cpu usage) Result {
	return Result{Scenario: scenario, Metric: "finish->next start", System: system, Tasks: int64(len(samples)), samples: samples, CPU: cpu}
}

// plainStint submits the fan-out's width of plain no-op tasks to a stint
// server in one call and works them, measured as the fan-out is.
func (b *bench) plainStint(ctx context.Context) ([]Result, error) {
	n := b.cfg.wf.n
	h, stop, err := b.stintServer(ctx, "wf_plain_stint", stintOptions{})
	if err != nil {
		return nil, err
	}
	defer stop()
	b.resetStatements(ctx)
	win := begin()
	if err := h.insertOwn(ctx, n); err != nil {
		return nil, err
	}
	submitted := time.Since(win.start)
	end, err := pollUntil(ctx, h.obs, b.cfg.pollEvery, `SELECT count(*) = $1 FROM stint_task WHERE status = 'success'`, n)
	if err != nil {
		return nil, err
	}
	b.collectStatements(ctx, sysPlain+" workflow fanout", h.dsn, end.Sub(win.start))
	return b.workflowResults(ctx, shapeFanOut, sysPlain, n, submitted, end.Sub(win.start), win.usage(), nil, "")
}

// stintServer starts a stint server built as o says (a server always) on
// a fresh database called name, and returns it with the function that
// stops it and closes its connections.
func (b *bench) stintServer(ctx context.Context, name string, o stintOptions) (*stintHarness, func(), error) {
	dsn, err := b.db.newDB(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	o.server = true
	h, err := newStint(ctx, dsn, b.cfg, b.log, o)
	if err != nil {
		return nil, nil, err
	}
	if err := h.start(ctx); err != nil {
		h.close()
		return nil, nil, err
	}
	return h, func() {
		_ = h.stop(context.WithoutCancel(ctx))
		h.close()
	}, nil
}

// workflowPgBoss runs one graph of shape on pg-boss: a Node.js process
// works, and submits the flow itself.
func (b *bench) workflowPgBoss(ctx context.Context, inst *npmInstall, shape string) ([]Result, error) {
	dsn, err := b.db.newDB(ctx, "wf_"+shape+"_pgboss")
	if err != nil {
		return nil, err
	}
	obs, err := newObserver(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer obs.Close()
	p, err := startChild(ctx, exec.Command(inst.node, inst.runner, dsn), nil)
	if err != nil {
		return nil, fmt.Errorf("pg-boss: %w", err)
	}
	defer func() {
		if err := p.stop(time.Minute); err != nil {
			p.kill()
		}
	}()
	cmd, total := b.cfg.wf.pgbossArgs(shape)
	win := begin()
	answer, err := p.ask(ctx, cmd)
	if err != nil {
		return nil, err
	}
	ms, err := strconv.ParseFloat(answer, 64)
	if err != nil {
		return nil, fmt.Errorf("pg-boss: flow answered %q", answer)
	}
	end, err := pollUntil(ctx, obs, b.cfg.pollEvery, `SELECT count(*) = $1 FROM pgboss.job WHERE name = 'bench_noop' AND state = 'completed'`, total)
	cpu := win.usage()
	if err != nil {
		return nil, err
	}
	return b.workflowResults(ctx, shape, sysPgBoss, total, time.Duration(ms*float64(time.Millisecond)), end.Sub(win.start), cpu, obs,
		`SELECT started_on, completed_on FROM pgboss.job WHERE name = 'bench_noop' ORDER BY (data->>'i')::int`)
}

// workflowResults returns the rows of one run: nodes per second, from
// the submit's start until all ended; the submit's time, for the fan-out;
// for the diamonds, workflows per second until all ended and of the
// submits alone;
// and for the chain, unless hops is empty, each hop from a node's finish
// to the next one's start, read with hops (a node's start and finish, in
// the chain's order).
func (b *bench) workflowResults(ctx context.Context, shape, system string, nodes int, submit, all time.Duration, cpu usage, db *pgxpool.Pool, hops string) ([]Result, error) {
	scenario := b.cfg.wf.scenario(shape)
	res := []Result{{Scenario: scenario, Metric: "work", System: system, Tasks: int64(nodes), Seconds: all.Seconds(), CPU: cpu}}
	switch shape {
	case shapeFanOut:
		res = append(res, Result{Scenario: scenario, Metric: "submit", System: system, Tasks: int64(nodes), Seconds: submit.Seconds(), CPU: unknownUsage})
	case shapeDiamonds:
		// The same runs counted in workflows: workflows/s in the rate.
		n := int64(b.cfg.wf.diamonds)
		res = append(res,
			Result{Scenario: scenario, Metric: "work, workflows", System: system, Tasks: n, Seconds: all.Seconds(), CPU: cpu},
			Result{Scenario: scenario, Metric: "submit, workflows", System: system, Tasks: n, Seconds: submit.Seconds(), CPU: unknownUsage})
	}
	if shape != shapeChain || hops == "" {
		return res, nil
	}
	rows, err := db.Query(ctx, hops)
	if err != nil {
		return nil, fmt.Errorf("read the chain's times: %w", err)
	}
	defer rows.Close()
	var samples []time.Duration
	var prevEnd *time.Time
	for rows.Next() {
		var start, end *time.Time
		if err := rows.Scan(&start, &end); err != nil {
			return nil, fmt.Errorf("read the chain's times: %w", err)
		}
		if prevEnd != nil && start != nil {
			samples = append(samples, start.Sub(*prevEnd))
		}
		prevEnd = end
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the chain's times: %w", err)
	}
	if len(samples) != nodes-1 {
		return nil, fmt.Errorf("%d hops measured in a chain of %d", len(samples), nodes)
	}
	return append(res, hopResult(scenario, system, samples, cpu)), nil
}

// pollUntil runs query (a boolean) every interval until it holds, and
// returns when it saw that.
func pollUntil(ctx context.Context, db *pgxpool.Pool, interval time.Duration, query string, args ...any) (time.Time, error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		var done bool
		if err := db.QueryRow(ctx, query, args...).Scan(&done); err != nil {
			return time.Time{}, fmt.Errorf("poll for the end of the graph: %w", err)
		}
		if done {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("wait for the end of the graph: %w", ctx.Err())
		case <-t.C:
		}
	}
}
