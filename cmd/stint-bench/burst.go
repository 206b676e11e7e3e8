package main

// The burst scenarios: tasks submitted as fast as they can be while the
// workers run, rated over the whole run with nothing left out.

import (
	"context"
	"fmt"
	"time"
)

// burst starts the worker side on an empty database, which then submits
// cfg.burstN tasks itself, in batch calls of cfg.burstBatch, as fast as it
// can while it runs them: tasks/s from the start until no task is left.
func (b *bench) burst(ctx context.Context, h harness, system, dsn string) ([]Result, error) {
	n := b.cfg.burstN
	secs, cpu, err := b.workAll(ctx, h, system, dsn, "burst", n, func(ctx context.Context) error {
		return addChunks(ctx, n, b.cfg.burstBatch, h.insertOwn)
	})
	if err != nil {
		return nil, err
	}
	return []Result{{Scenario: "burst", Metric: "work", System: system, Tasks: int64(n), Seconds: secs, CPU: cpu}}, nil
}

// drainBurst starts the worker side, then runs cfg.drainCycles cycles of:
// wait for the queue to be empty, ANALYZE (the planner's statistics then
// say the queue is empty), and a burst of cfg.burstN tasks from a client
// process, in batch calls of cfg.burstBatch. Its rate is all the cycles'
// tasks over the sum of the cycles' times, each from the burst's start
// until no task is left.
func (b *bench) drainBurst(ctx context.Context, h harness, system, dsn string) ([]Result, error) {
	add, stopClient, err := b.clientProcess(ctx, h, system, dsn)
	if err != nil {
		return nil, err
	}
	defer stopClient()
	if err := h.start(ctx); err != nil {
		return nil, err
	}
	fail := func(err error) ([]Result, error) {
		_ = h.stop(context.WithoutCancel(ctx))
		return nil, err
	}
	n, cycles := b.cfg.burstN, b.cfg.drainCycles
	stopProf := b.profile(system, "drain-burst")
	b.resetStatements(ctx)
	win := begin()
	var busy time.Duration
	for range cycles {
		if _, err := waitDrained(ctx, h.observer(), h.queries(), b.cfg.pollEvery); err != nil {
			stopProf()
			return fail(err)
		}
		if _, err := h.observer().Exec(ctx, "ANALYZE"); err != nil {
			stopProf()
			return fail(fmt.Errorf("analyze: %w", err))
		}
		start := time.Now()
		if err := add(ctx, n, b.cfg.burstBatch); err != nil {
			stopProf()
			return fail(err)
		}
		end, err := waitDrained(ctx, h.observer(), h.queries(), b.cfg.pollEvery)
		if err != nil {
			stopProf()
			return fail(err)
		}
		busy += end.Sub(start)
	}
	cpu := win.usage()
	stopProf()
	b.collectStatements(ctx, system+" drain-burst", dsn, time.Since(win.start))
	if err := h.stop(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	total := int64(n) * int64(cycles)
	if err := checkCompleted(ctx, h.observer(), h.queries().completed, total); err != nil {
		return nil, err
	}
	return []Result{{Scenario: "drain-burst", Metric: "work", System: system, Tasks: total, Seconds: busy.Seconds(), CPU: cpu}}, nil
}

// clientProcess returns the add of a separate client process of system on
// dsn (n tasks in batch calls of chunk each) and the function that stops
// it. Graphile Worker's and DBOS's harnesses have one already.
func (b *bench) clientProcess(ctx context.Context, h harness, system, dsn string) (add func(ctx context.Context, n, chunk int) error, stop func(), err error) {
	switch h := h.(type) {
	case *graphileHarness:
		return h.client.add, func() {}, nil
	case *dbosHarness:
		return h.client.add, func() {}, nil
	}
	c, err := startSelf(ctx, clientCommand, b.childArgs(system, dsn))
	if err != nil {
		return nil, nil, fmt.Errorf("start a %s client process: %w", system, err)
	}
	stop = func() {
		if err := c.stop(time.Minute); err != nil {
			b.rep.Notes = append(b.rep.Notes, err.Error())
		}
	}
	return c.add, stop, nil
}
