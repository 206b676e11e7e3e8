package main

// The concurrent-submit scenario: many callers, each submitting one task
// (a web service enqueuing one task per request), while the workers run.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
)

// scenarioConcurrent names the concurrent-submit scenario, and its metrics
// the submitter: a client on a pool of its own, or the working process
// itself (stint's server node, River's working client).
const (
	scenarioConcurrent   = "concurrent submit"
	metricConcurrentCli  = "submits, client"
	metricConcurrentSelf = "submits, server"
)

// concurrentJobs returns the scenario's jobs for the systems picked: stint
// and River from a client and from the working process, and the floor: as
// many connections as stint's pool, each inserting one row per durable
// statement.
func (b *bench) concurrentJobs() []job {
	var jobs []job
	for _, self := range []bool{false, true} {
		if b.cfg.has(sysStint) {
			jobs = append(jobs, job{scenarioConcurrent, sysStint, func(ctx context.Context) ([]Result, error) { return b.concurrentStint(ctx, self) }})
		}
		if b.cfg.has(sysRiver) {
			jobs = append(jobs, job{scenarioConcurrent, sysRiver, func(ctx context.Context) ([]Result, error) { return b.concurrentRiver(ctx, self) }})
		}
	}
	if b.cfg.has(sysFloor) {
		jobs = append(jobs, job{scenarioConcurrent, sysFloor, b.concurrentFloor})
	}
	return jobs
}

// concurrentMetric is the metric of a run from a client or, with self, from
// the working process.
func concurrentMetric(self bool) string {
	if self {
		return metricConcurrentSelf
	}
	return metricConcurrentCli
}

// concurrentStint runs stint's concurrent submits through the client or,
// with self, through the server node, which works them meanwhile.
func (b *bench) concurrentStint(ctx context.Context, self bool) ([]Result, error) {
	dsn, err := b.db.newDB(ctx, "concurrent_stint")
	if err != nil {
		return nil, err
	}
	h, err := newStint(ctx, dsn, b.cfg, b.log, stintOptions{server: true, client: true})
	if err != nil {
		return nil, err
	}
	defer h.close()
	if err := h.start(ctx); err != nil {
		return nil, err
	}
	var submitter api.Tasks = h.cli
	if self {
		submitter = h.srv
	}
	n := b.cfg.concurrentN
	ids := make([]api.TaskID, n)
	return b.concurrentRun(ctx, h, sysStint, dsn, self, func(ctx context.Context, i int) error {
		sub, err := submitter.Submit(ctx, api.SubmitRequest{Behavior: noopKind.ID})
		ids[i] = sub.ID
		return err
	}, func() error { return distinctIDs(ids) })
}

// distinctIDs fails unless every caller got an id of its own.
func distinctIDs(ids []api.TaskID) error {
	seen := make(map[api.TaskID]bool, len(ids))
	for i, id := range ids {
		if id == "" || seen[id] {
			return fmt.Errorf("caller %d got the id %q, empty or another's", i, id)
		}
		seen[id] = true
	}
	return nil
}

// concurrentRiver runs River's concurrent Inserts through the insert-only
// client or, with self, through the working client.
func (b *bench) concurrentRiver(ctx context.Context, self bool) ([]Result, error) {
	dsn, err := b.db.newDB(ctx, "concurrent_river")
	if err != nil {
		return nil, err
	}
	h, err := newRiver(ctx, dsn, b.cfg, b.log, riverOptions{worker: true, inserter: true})
	if err != nil {
		return nil, err
	}
	defer h.close()
	if err := h.start(ctx); err != nil {
		return nil, err
	}
	ins := h.ins
	if self {
		ins = h.cl
	}
	return b.concurrentRun(ctx, h, sysRiver, dsn, self, func(ctx context.Context, i int) error {
		_, err := ins.Insert(ctx, riverArgs{Seq: i}, nil)
		return err
	}, nil)
}

// concurrentRun calls submit once from each of cfg.concurrentN goroutines,
// released together while h works, and rates the submits from the release
// until the last returned. It then waits for the workers to finish every
// task and checks them, and check's verdict (if not nil).
func (b *bench) concurrentRun(ctx context.Context, h harness, system, dsn string, self bool, submit func(context.Context, int) error, check func() error) ([]Result, error) {
	n := b.cfg.concurrentN
	stopProf := b.profile(system, "concurrent-submit")
	b.resetStatements(ctx)
	win := begin()
	secs, err := released(ctx, n, submit)
	cpu := win.usage()
	stopProf()
	b.collectStatements(ctx, fmt.Sprintf("%s %s %s", system, scenarioConcurrent, concurrentMetric(self)), dsn, time.Since(win.start))
	if err == nil && check != nil {
		err = check()
	}
	if err == nil {
		_, err = waitDrained(ctx, h.observer(), h.queries(), b.cfg.pollEvery)
	}
	stopErr := h.stop(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	if stopErr != nil {
		return nil, stopErr
	}
	if err := checkCompleted(ctx, h.observer(), h.queries().completed, int64(n)); err != nil {
		return nil, err
	}
	return []Result{{Scenario: scenarioConcurrent, Metric: concurrentMetric(self), System: system, Tasks: int64(n), Seconds: secs, CPU: cpu}}, nil
}

// released starts n goroutines, releases them together, each calling
// call once with its number, and returns the seconds from the release
// until the last returned.
func released(ctx context.Context, n int, call func(context.Context, int) error) (float64, error) {
	errs := make([]error, n)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			errs[i] = call(ctx, i)
		}()
	}
	start := time.Now()
	close(release)
	wg.Wait()
	secs := time.Since(start).Seconds()
	if err := errors.Join(errs...); err != nil {
		return 0, fmt.Errorf("concurrent submits: %w", err)
	}
	return secs, nil
}

// concurrentFloor is the floor of the scenario: as many connections as
// stint's pool holds (cfg.stintMaxConns, or stint's default 20), each
// inserting rows one per durable statement (autocommit), as pgbench's
// clients do, cfg.concurrentN rows in all.
func (b *bench) concurrentFloor(ctx context.Context) ([]Result, error) {
	dsn, err := b.db.newDB(ctx, "concurrent_floor")
	if err != nil {
		return nil, err
	}
	conns := b.cfg.floorConns()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	cfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open the floor's pool: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE floor_one (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("create the floor's table: %w", err)
	}
	// Every connection open and warm before the window, as pgbench's are.
	if _, err := released(ctx, conns, func(ctx context.Context, _ int) error {
		_, err := pool.Exec(ctx, `SELECT count(*) FROM floor_one`)
		return err
	}); err != nil {
		return nil, err
	}
	n := b.cfg.concurrentN
	win := begin()
	secs, err := released(ctx, conns, func(ctx context.Context, c int) error {
		for i := c; i < n; i += conns {
			if _, err := pool.Exec(ctx, `INSERT INTO floor_one (id) VALUES ($1)`, i); err != nil {
				return err
			}
		}
		return nil
	})
	cpu := win.usage()
	if err != nil {
		return nil, err
	}
	if got, err := count(ctx, pool, `SELECT count(*) FROM floor_one`); err != nil || got != int64(n) {
		return nil, fmt.Errorf("the floor inserted %d rows, want %d (%v)", got, n, err)
	}
	return []Result{{Scenario: scenarioConcurrent, Metric: metricConcurrentCli, System: fmt.Sprintf("%s (%d conns, a row per statement)", sysFloor, conns),
		Tasks: int64(n), Seconds: secs, CPU: cpu}}, nil
}

// floorConns is the number of connections of the concurrent-submit floor:
// stint's pool size.
func (c config) floorConns() int {
	if c.stintMaxConns > 0 {
		return c.stintMaxConns
	}
	return 20
}
