package main

// The latency scenario: single tasks submitted at a steady rate, the time
// from each submit to its run's start and to its awaited result.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/stinthq/stint/api"
)

// latencyStint runs stint's latency, its tasks submitted through a
// separate client or, with viaServer, through the server node.
func (b *bench) latencyStint(ctx context.Context, viaServer bool) ([]Result, error) {
	label, system := "latency_stint", sysStint+" (defaults)"
	var submitter api.Tasks
	if viaServer {
		label, system = "latency_stint_server", sysStint+" (defaults, server submits)"
	}
	if b.cfg.stintNoLocal {
		system = strings.TrimSuffix(system, ")") + ", no local start)"
	}
	dsn, err := b.db.newDB(ctx, label)
	if err != nil {
		return nil, err
	}
	// stint at its defaults: no tuning of the server, client or store.
	h, err := newStint(ctx, dsn, b.cfg, b.log, stintOptions{server: true, client: true, defaults: true})
	if err != nil {
		return nil, err
	}
	defer h.close()
	h.pr.arm()
	if err := h.start(ctx); err != nil {
		return nil, err
	}
	submitter = h.cli
	if viaServer {
		submitter = h.srv
	}
	stopProf := b.profile(sysStint, "latency")
	b.resetStatements(ctx)
	win := begin()
	total := b.total()
	stored, awaited := make([]time.Duration, total), make([]time.Duration, total)
	submitted, err := paced(ctx, total, b.cfg.latRate, func(ctx context.Context, i int) error {
		start := time.Now()
		f, err := api.Submit(ctx, submitter, noopKind, struct{}{}, api.WithID(latencyID(i)))
		if err != nil {
			return err
		}
		stored[i] = time.Since(start)
		if b.cfg.latNoAwait {
			return nil
		}
		if _, err := f.Await(ctx); err != nil {
			return fmt.Errorf("await %s: %w", f.ID(), err)
		}
		awaited[i] = time.Since(start)
		return nil
	})
	cpu := win.usage()
	if err == nil && b.cfg.latNoAwait {
		// Without Await nothing waited for the runs: wait for them to start.
		err = waitFor(ctx, 30*time.Second, func() bool { return h.pr.started.Load() >= int64(total) })
	}
	stopProf()
	b.collectStatements(ctx, sysStint+" latency", dsn, time.Since(win.start))
	stopErr := h.stop(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	if stopErr != nil {
		return nil, stopErr
	}
	toStart, err := startLatencies(h.pr, submitted, latencyID)
	if err != nil {
		return nil, err
	}
	w := b.warmup()
	n := int64(total - w)
	res := []Result{
		{Scenario: "latency", Metric: "submit->stored", System: system, Tasks: n, samples: stored[w:], CPU: cpu},
		{Scenario: "latency", Metric: "submit->start", System: system, Tasks: n, samples: toStart[w:], CPU: cpu},
	}
	if !b.cfg.latNoAwait {
		res = append(res, Result{Scenario: "latency", Metric: "submit->await", System: system, Tasks: n, samples: awaited[w:], CPU: cpu})
	}
	return res, nil
}

// latencyRiver runs River's latency at its default fetch timing or tuned.
func (b *bench) latencyRiver(ctx context.Context, defaults bool) ([]Result, error) {
	label, system := "latency_river_tuned", sysRiver+" (tuned)"
	if defaults {
		label, system = "latency_river_defaults", sysRiver+" (defaults)"
	}
	dsn, err := b.db.newDB(ctx, label)
	if err != nil {
		return nil, err
	}
	h, err := newRiver(ctx, dsn, b.cfg, b.log, riverOptions{worker: true, inserter: true, defaults: defaults})
	if err != nil {
		return nil, err
	}
	defer h.close()
	h.pr.arm()
	if err := h.start(ctx); err != nil {
		return nil, err
	}
	b.resetStatements(ctx)
	win := begin()
	total := b.total()
	stored := make([]time.Duration, total)
	submitted, err := paced(ctx, total, b.cfg.latRate, func(ctx context.Context, i int) error {
		start := time.Now()
		if _, err := h.ins.Insert(ctx, riverArgs{Seq: i}, nil); err != nil {
			return err
		}
		stored[i] = time.Since(start)
		return nil
	})
	if err == nil {
		// River has no await: wait for every run to start.
		err = waitFor(ctx, 30*time.Second, func() bool { return h.pr.started.Load() >= int64(total) })
	}
	cpu := win.usage()
	b.collectStatements(ctx, system+" latency", dsn, time.Since(win.start))
	stopErr := h.stop(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	if stopErr != nil {
		return nil, stopErr
	}
	toStart, err := startLatencies(h.pr, submitted, func(i int) string { return fmt.Sprint(i) })
	if err != nil {
		return nil, err
	}
	w := b.warmup()
	n := int64(total - w)
	return []Result{
		{Scenario: "latency", Metric: "submit->stored", System: system, Tasks: n, samples: stored[w:], CPU: cpu},
		{Scenario: "latency", Metric: "submit->start", System: system, Tasks: n, samples: toStart[w:], CPU: cpu},
	}, nil
}

// total is the number of tasks the latency scenario submits, warm-up
// included.
func (b *bench) total() int {
	return b.warmup() + max(1, int(float64(b.cfg.latRate)*b.cfg.latDur.Seconds()))
}

// warmup is the number of tasks the latency scenario submits before its
// window: their latencies are left out. A process's first submits open and
// warm its pool's connections (each new PostgreSQL backend loads its
// catalog caches on its first statements), which at 100 submits/s on 2
// cores takes a few hundred milliseconds.
func (b *bench) warmup() int {
	return int(float64(b.cfg.latRate) * b.cfg.latWarmup.Seconds())
}

func latencyID(i int) api.TaskID { return api.TaskID(fmt.Sprintf("lat-%07d", i)) }

// paced calls submit(i) for i in [0, total) at rate per second, each in its
// own goroutine so that a slow one does not delay the next, and returns when
// each submit began. It waits for all of them.
func paced(ctx context.Context, total, rate int, submit func(ctx context.Context, i int) error) ([]time.Time, error) {
	at := make([]time.Time, total)
	errs := make([]error, total)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range total {
		if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
			sleep(ctx, d)
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			at[i] = time.Now()
			errs[i] = submit(ctx, i)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("submit: %w", err)
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("submit: %w", ctx.Err())
	}
	return at, nil
}

// startLatencies pairs submit times with the start times the probe recorded.
func startLatencies[K ~string](pr *probe, submitted []time.Time, key func(int) K) ([]time.Duration, error) {
	out := make([]time.Duration, len(submitted))
	for i, at := range submitted {
		started, ok := pr.startOf(string(key(i)))
		if !ok {
			return nil, fmt.Errorf("task %s never started", key(i))
		}
		out[i] = started.Sub(at)
	}
	return out, nil
}
