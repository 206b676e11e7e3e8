package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// bench runs the scenarios and collects the report.
type bench struct {
	cfg      config
	log      *slog.Logger
	db       *dbServer
	progress io.Writer // progress lines, or nil
	warn     io.Writer // lines always shown (a peer that cannot run), or nil

	statements bool        // pg_stat_statements is available
	graphile   *npmInstall // Graphile Worker, when it runs
	dbosBin    string      // DBOS's runner, when it runs
	rep        *Report
}

// logf writes a progress line when -v is set.
func (b *bench) logf(format string, args ...any) {
	if b.progress != nil {
		fmt.Fprintf(b.progress, "stint-bench: "+format+"\n", args...)
	}
}

// run runs the picked scenarios on every picked system and returns the
// report. A failing run becomes a row with its error; only a broken setup
// fails run.
func (b *bench) run(ctx context.Context) (*Report, error) {
	settings, err := b.db.settings(ctx)
	if err != nil {
		return nil, err
	}
	b.rep = &Report{Started: time.Now().UTC(), Postgres: settings, Config: b.cfg.summary()}
	b.rep.Postgres.CPUs = numCPU()
	if b.cfg.sqlprofile {
		ok, why, err := b.db.enableStatements(ctx)
		if err != nil {
			return nil, err
		}
		if !ok {
			b.rep.Notes = append(b.rep.Notes, "no SQL profile: "+why)
		}
		b.statements = ok
	}
	c := b.cfg
	var raw []Result
	rounds := func(jobs ...job) {
		for r := range c.runs {
			// Rotate the order so that no system always goes first.
			for i := range jobs {
				raw = append(raw, b.do(ctx, jobs[(i+r)%len(jobs)])...)
			}
		}
	}
	b.graphile = b.graphileAvailable(ctx)
	// peers are the systems with a worker and a client side that run.
	var peers []string
	for _, sys := range []string{sysStint, sysRiver, sysGraphile} {
		if c.has(sys) && (sys != sysGraphile || b.graphile != nil) {
			peers = append(peers, sys)
		}
	}
	b.dbosBin = b.dbosAvailable(ctx)
	// DBOS takes part in the burn-down and streaming of the scenarios
	// below, besides latency and signals.
	queuePeers := peers
	if b.dbosBin != "" {
		queuePeers = append(slices.Clone(peers), sysDBOS)
	}
	freshOf := func(systems []string, scenario, prefix string, fn func(context.Context, harness, string, string) ([]Result, error)) []job {
		var jobs []job
		for _, sys := range systems {
			jobs = append(jobs, job{scenario, sys, b.onFresh(prefix, sys, fn)})
		}
		return jobs
	}
	fresh := func(scenario, prefix string, fn func(context.Context, harness, string, string) ([]Result, error)) []job {
		return freshOf(peers, scenario, prefix, fn)
	}
	var jobs []job
	if c.burndown {
		jobs = freshOf(queuePeers, "burn-down", "burndown", b.burndown)
	}
	if c.floor && c.has(sysFloor) {
		jobs = append(jobs, job{"floor", sysFloor, b.floorRun})
	}
	for _, jobs := range [][]job{
		jobs,
		when(c.streaming, freshOf(queuePeers, "streaming", "streaming", b.streaming(false))),
		when(c.streaming, freshOf(queuePeers, scenarioStreamingClient, "streaming_client", b.streaming(true))),
		when(c.burst, fresh("burst", "burst", b.burst)),
		when(c.drainBurst, fresh("drain-burst", "drainburst", b.drainBurst)),
	} {
		if len(jobs) > 0 {
			rounds(jobs...)
		}
	}
	if c.latency {
		jobs = nil
		for _, via := range splitList(c.latSubmit) {
			if c.has(sysStint) {
				jobs = append(jobs, job{"latency", sysStint, func(ctx context.Context) ([]Result, error) { return b.latencyStint(ctx, via == "server") }})
			}
		}
		if c.has(sysRiver) {
			jobs = append(jobs,
				job{"latency", sysRiver + " (defaults)", func(ctx context.Context) ([]Result, error) { return b.latencyRiver(ctx, true) }},
				job{"latency", sysRiver + " (tuned)", func(ctx context.Context) ([]Result, error) { return b.latencyRiver(ctx, false) }})
		}
		if b.dbosBin != "" {
			jobs = append(jobs,
				job{"latency", sysDBOS + " (defaults)", func(ctx context.Context) ([]Result, error) { return b.latencyDBOS(ctx, true) }},
				job{"latency", sysDBOS + " (tuned)", func(ctx context.Context) ([]Result, error) { return b.latencyDBOS(ctx, false) }})
		}
		if len(jobs) > 0 {
			rounds(jobs...)
		}
	}
	if c.concurrent {
		if jobs := b.concurrentJobs(); len(jobs) > 0 {
			rounds(jobs...)
		}
	}
	if c.shapes && c.has(sysStint) {
		for _, jobs := range b.shapeJobs() {
			rounds(jobs...)
		}
	}
	if c.has(sysStint) {
		for _, jobs := range b.flowJobs() {
			rounds(jobs...)
		}
	}
	if c.sig.on {
		for _, jobs := range b.signalJobs() {
			rounds(jobs...)
		}
	}
	if c.wf.on {
		for _, jobs := range b.workflowJobs(ctx) {
			rounds(jobs...)
		}
	}
	if c.scale {
		for _, k := range c.scaleNodes {
			jobs = nil
			for _, sys := range peers {
				jobs = append(jobs, job{fmt.Sprintf("scale %d", k), sys, func(ctx context.Context) ([]Result, error) { return b.scaleRun(ctx, sys, k) }})
			}
			if len(jobs) > 0 {
				rounds(jobs...)
			}
		}
	}
	b.rep.Results = aggregate(raw)
	b.rep.computeRatios()
	return b.rep, nil
}

// when returns jobs if cond holds, else none.
func when(cond bool, jobs []job) []job {
	if !cond {
		return nil
	}
	return jobs
}

// job is one scenario of one system.
type job struct {
	scenario, system string
	fn               func(context.Context) ([]Result, error)
}

// do runs a job under the timeout and returns its results, or its error as
// a row.
func (b *bench) do(ctx context.Context, j job) []Result {
	if ctx.Err() != nil {
		return nil
	}
	b.logf("%s: %s", j.scenario, j.system)
	rctx, cancel := context.WithTimeout(ctx, b.cfg.timeout)
	defer cancel()
	res, err := j.fn(rctx)
	if err != nil {
		b.logf("%s: %s: %v", j.scenario, j.system, err)
		res = append(res, Result{Scenario: j.scenario, System: j.system, Error: err.Error()})
	}
	for _, r := range res {
		if r.Error == "" {
			b.logf("  %s %s %s: %s", r.Scenario, r.Metric, r.System, r.value())
		}
	}
	dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer dcancel()
	if err := b.db.dropDBs(dctx); err != nil {
		b.rep.Notes = append(b.rep.Notes, err.Error())
	}
	return res
}

// ---- burn-down

// onFresh returns a job running scenario for system on a database of its
// own (named prefix_system), with a harness that inserts and works.
func (b *bench) onFresh(prefix, system string, scenario func(context.Context, harness, string, string) ([]Result, error)) func(context.Context) ([]Result, error) {
	return func(ctx context.Context) ([]Result, error) {
		dsn, err := b.db.newDB(ctx, prefix+"_"+system)
		if err != nil {
			return nil, err
		}
		h, err := b.newHarness(ctx, system, dsn)
		if err != nil {
			return nil, err
		}
		defer h.close()
		return scenario(ctx, h, system, dsn)
	}
}

// newHarness builds system on dsn with its worker side and client side.
func (b *bench) newHarness(ctx context.Context, system, dsn string) (harness, error) {
	switch system {
	case sysStint:
		return newStint(ctx, dsn, b.cfg, b.log, stintOptions{server: true, client: true})
	case sysRiver:
		return newRiver(ctx, dsn, b.cfg, b.log, riverOptions{worker: true, inserter: true})
	case sysGraphile:
		return newGraphile(ctx, b.graphile, dsn, b.cfg.graphileProcs)
	case sysDBOS:
		return b.newDBOS(ctx, dsn)
	}
	return nil, fmt.Errorf("unknown system %q", system)
}

// burndown inserts cfg.n tasks in batches, then works them all: the insert
// rate and the work rate (from starting the workers to seeing no task left).
func (b *bench) burndown(ctx context.Context, h harness, system, dsn string) ([]Result, error) {
	n := b.cfg.n
	stopProf := b.profile(system, "burndown-insert")
	win := begin()
	insertDur, err := insertAll(ctx, h, n, b.cfg.batch)
	stopProf()
	if err != nil {
		return nil, err
	}
	res := []Result{{Scenario: "burn-down", Metric: "insert", System: system, Tasks: int64(n), Seconds: insertDur.Seconds(), CPU: win.usage()}}

	secs, cpu, err := b.workAll(ctx, h, system, dsn, "burn-down work", n, nil)
	if err != nil {
		return nil, err
	}
	return append(res, Result{Scenario: "burn-down", Metric: "work", System: system, Tasks: int64(n), Seconds: secs, CPU: cpu}), nil
}

// workAll starts h's worker side, runs during (if not nil) and waits until
// no task is left, then stops the workers and checks that n tasks
// completed. It returns the seconds from the start until none was left and
// the CPU usage meanwhile; run names it in profiles.
func (b *bench) workAll(ctx context.Context, h harness, system, dsn, run string, n int, during func(context.Context) error) (float64, usage, error) {
	stopProf := b.profile(system, sanitize(run))
	b.resetStatements(ctx)
	win := begin()
	start := win.start
	if err := h.start(ctx); err != nil {
		stopProf()
		return 0, usage{}, err
	}
	var err error
	if during != nil {
		err = during(ctx)
	}
	var end time.Time
	if err == nil {
		end, err = waitDrained(ctx, h.observer(), h.queries(), b.cfg.pollEvery)
	}
	cpu := win.usage()
	stopProf()
	b.collectStatements(ctx, system+" "+run, dsn, time.Since(start))
	stopErr := h.stop(context.WithoutCancel(ctx))
	if err != nil {
		return 0, usage{}, err
	}
	if stopErr != nil {
		return 0, usage{}, stopErr
	}
	if err := checkCompleted(ctx, h.observer(), h.queries().completed, int64(n)); err != nil {
		return 0, usage{}, err
	}
	return end.Sub(start).Seconds(), cpu, nil
}

// insertAll inserts n tasks in batches through h's client side.
func insertAll(ctx context.Context, h harness, n, batch int) (time.Duration, error) {
	start := time.Now()
	for left := n; left > 0; {
		k := min(left, batch)
		if err := h.insert(ctx, k); err != nil {
			return 0, err
		}
		left -= k
	}
	return time.Since(start), nil
}

// waitDrained polls q every interval until it finds no pending task, and
// returns when it saw that.
func waitDrained(ctx context.Context, pool *pgxpool.Pool, q queries, interval time.Duration) (time.Time, error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	p := drainPoll{pool: pool, q: q}
	for {
		left, err := p.pending(ctx)
		if err != nil {
			return time.Time{}, fmt.Errorf("poll for the end of the burn-down: %w", err)
		}
		if !left {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("wait for the end of the burn-down: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// drainPoll asks whether any task is pending. With q.pendingFrom, each poll
// resumes at the pending task the one before found; only a poll that finds
// none from there looks at the whole table, and only that one can say that
// none is left, so a pending task that moved before the resume point is
// still seen.
type drainPoll struct {
	pool *pgxpool.Pool
	q    queries
	from string // the resume point: a ctid, as text
}

// pending reports whether a task is pending.
func (p *drainPoll) pending(ctx context.Context) (bool, error) {
	if p.q.pendingFrom == "" {
		var left bool
		err := p.pool.QueryRow(ctx, p.q.pending).Scan(&left)
		return left, err
	}
	const start = "(0,0)"
	if p.from == "" {
		p.from = start
	}
	for {
		err := p.pool.QueryRow(ctx, p.q.pendingFrom, p.from).Scan(&p.from)
		if !errors.Is(err, pgx.ErrNoRows) {
			return err == nil, err
		}
		if p.from == start {
			return false, nil
		}
		p.from = start
	}
}

// count runs a count query.
func count(ctx context.Context, pool *pgxpool.Pool, query string) (int64, error) {
	var n int64
	if err := pool.QueryRow(ctx, query).Scan(&n); err != nil {
		return 0, fmt.Errorf("count completed tasks: %w", err)
	}
	return n, nil
}

// checkCompleted fails unless exactly want tasks completed.
func checkCompleted(ctx context.Context, pool *pgxpool.Pool, query string, want int64) error {
	got, err := count(ctx, pool, query)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%d tasks completed, want %d", got, want)
	}
	return nil
}

// ---- streaming

// streaming returns the streaming scenario, its tasks submitted by the
// harness's client side or, with viaClient, by a separate client process.
func (b *bench) streaming(viaClient bool) func(context.Context, harness, string, string) ([]Result, error) {
	return func(ctx context.Context, h harness, system, dsn string) ([]Result, error) {
		if !viaClient {
			return b.stream(ctx, h, system, dsn, "streaming", h.insert)
		}
		add, stopClient, err := b.clientProcess(ctx, h, system, dsn)
		if err != nil {
			return nil, err
		}
		defer stopClient()
		return b.stream(ctx, h, system, dsn, scenarioStreamingClient, func(ctx context.Context, n int) error { return add(ctx, n, n) })
	}
}

// scenarioStreamingClient names the streaming scenario whose tasks come
// from a separate client process.
const scenarioStreamingClient = "streaming, client process"

// stream inserts batches with insert from a goroutine of its own, keeping
// at most cfg.streamBacklog tasks inserted but not started, while the
// workers run; after the warm-up it counts the tasks completed during
// cfg.streamDur.
func (b *bench) stream(ctx context.Context, h harness, system, dsn, scenario string, insert func(context.Context, int) error) ([]Result, error) {
	pr := h.probe()
	var inserted atomic.Int64
	ictx, icancel := context.WithCancel(ctx)
	defer icancel()
	ready := make(chan struct{})
	var readyOnce sync.Once
	var ierr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer readyOnce.Do(func() { close(ready) })
		for ictx.Err() == nil {
			if inserted.Load()-pr.started.Load() >= int64(b.cfg.streamBacklog) {
				readyOnce.Do(func() { close(ready) })
				sleep(ictx, time.Millisecond)
				continue
			}
			if err := insert(ictx, b.cfg.streamBatch); err != nil {
				if ictx.Err() == nil {
					ierr = err
				}
				return
			}
			inserted.Add(int64(b.cfg.streamBatch))
		}
	}()
	stopInserter := func() error {
		icancel()
		wg.Wait()
		return ierr
	}
	<-ready
	if ierr != nil {
		return nil, stopInserter()
	}
	if err := h.start(ctx); err != nil {
		_ = stopInserter()
		return nil, err
	}
	fail := func(err error) ([]Result, error) {
		_ = stopInserter()
		_ = h.stop(context.WithoutCancel(ctx))
		return nil, err
	}
	sleep(ctx, b.cfg.streamWarmup)
	c0, err := count(ctx, h.observer(), h.queries().completed)
	if err != nil {
		return fail(err)
	}
	win := begin()
	i0, t0 := inserted.Load(), win.start
	stopProf := b.profile(system, sanitize(scenario))
	b.resetStatements(ctx)
	sleep(ctx, b.cfg.streamDur)
	c1, err := count(ctx, h.observer(), h.queries().completed)
	i1, t1 := inserted.Load(), time.Now()
	cpu := win.usage()
	stopProf()
	b.collectStatements(ctx, system+" "+scenario, dsn, t1.Sub(t0))
	if err != nil {
		return fail(err)
	}
	if ctx.Err() != nil {
		return fail(ctx.Err())
	}
	if err := stopInserter(); err != nil {
		_ = h.stop(context.WithoutCancel(ctx))
		return nil, err
	}
	if err := h.stop(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	secs := t1.Sub(t0).Seconds()
	return []Result{
		{Scenario: scenario, Metric: "insert", System: system, Tasks: i1 - i0, Seconds: secs, CPU: cpu},
		{Scenario: scenario, Metric: "work", System: system, Tasks: c1 - c0, Seconds: secs, CPU: cpu},
	}, nil
}

// waitFor polls cond every millisecond until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", timeout)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
