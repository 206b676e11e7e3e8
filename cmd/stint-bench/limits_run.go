package main

// The runs of the flow-control scenarios; see limits.go.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/stinthq/stint/api"
)

// The systems of the flow-control rows: stint with and without what the
// scenario measures.
const (
	sysWithLimits = "stint, limits"
	sysNoLimits   = "stint, no limits"
	sysCapped     = "stint, cluster cap"
	sysNoCap      = "stint, no cap"
	sysBigAlone   = "stint, big key alone"
	sysBigSmall   = "stint, with the small key"
)

// flowJobs returns the jobs of the flow-control scenarios picked, each
// scenario's runs to be interleaved.
func (b *bench) flowJobs() [][]job {
	f := b.cfg.flow
	var out [][]job
	if f.limitsCost {
		out = append(out, []job{
			{"limits-cost", sysWithLimits, func(ctx context.Context) ([]Result, error) { return b.limitsCostRun(ctx, true) }},
			{"limits-cost", sysNoLimits, func(ctx context.Context) ([]Result, error) { return b.limitsCostRun(ctx, false) }},
		})
	}
	if f.globalCap {
		out = append(out, []job{
			{"global-cap", sysCapped, func(ctx context.Context) ([]Result, error) { return b.globalCapRun(ctx, true) }},
			{"global-cap", sysNoCap, func(ctx context.Context) ([]Result, error) { return b.globalCapRun(ctx, false) }},
		})
	}
	if f.rate {
		out = append(out, []job{{"rate", sysStint, b.rateRun}})
	}
	if f.fair {
		out = append(out, []job{
			{"fair", sysBigSmall, func(ctx context.Context) ([]Result, error) { return b.fairRun(ctx, true) }},
			{"fair", sysBigAlone, func(ctx context.Context) ([]Result, error) { return b.fairRun(ctx, false) }},
		})
	}
	return out
}

// limitsCostRun inserts cfg.flow.costN no-op tasks, limited or not, and
// works them with one node: the work rate from the start until none is
// left.
func (b *bench) limitsCostRun(ctx context.Context, limited bool) ([]Result, error) {
	behavior, system, base := flowNoop, sysNoLimits, ""
	if limited {
		behavior, system, base = flowLimited, sysWithLimits, sysNoLimits
	}
	n := b.cfg.flow.costN
	h, dsn, err := b.flowHarness(ctx, "limitscost_"+string(behavior), true, 0, api.SubmitRequest{Behavior: behavior}, n)
	if err != nil {
		return nil, err
	}
	defer h.close()
	secs, cpu, err := b.workAll(ctx, h, sysStint, dsn, "limits-cost "+system, n, nil)
	if err != nil {
		return nil, err
	}
	return []Result{{Scenario: "limits-cost", Metric: "work", System: system, Base: base, Tasks: int64(n), Seconds: secs, CPU: cpu}}, nil
}

// globalCapRun inserts cfg.flow.capN sleeping tasks, capped across the
// cluster or not, and works them with cfg.flow.capNodes node processes of
// cfg.flow.capWorkers workers each: the rate from their start until none
// is left, and the most runs at once across the nodes.
func (b *bench) globalCapRun(ctx context.Context, capped bool) ([]Result, error) {
	f := b.cfg.flow
	behavior, system, base := flowSleep, sysNoCap, ""
	if capped {
		behavior, system, base = flowCapped, sysCapped, sysNoCap
	}
	h, dsn, err := b.flowHarness(ctx, "globalcap_"+string(behavior), false, 0, api.SubmitRequest{Behavior: behavior}, f.capN)
	if err != nil {
		return nil, err
	}
	defer h.close()
	secs, cpu, spans, err := b.workNodes(ctx, h, dsn, "global-cap "+system, f.capNodes, f.capN, func(i int) []string {
		args := append(b.nodeArgs(sysStint, dsn, fmt.Sprintf("bench-node-%d", i+1)), f.behaviorArgs()...)
		// Later flags win: the nodes' workers are the scenario's.
		return append(args, "--stint-workers", strconv.Itoa(f.capWorkers))
	})
	if err != nil {
		return nil, err
	}
	if len(spans) != f.capN {
		return nil, fmt.Errorf("the nodes reported %d runs, want %d", len(spans), f.capN)
	}
	c := Check{Scenario: "global-cap", System: system, What: "most tasks running at once, all nodes", Value: float64(mostAtOnce(spans)),
		Note: fmt.Sprintf("%d nodes × %d workers", f.capNodes, f.capWorkers)}
	if capped {
		c.Bound = float64(f.capMax)
	}
	b.addCheck(c)
	return []Result{{Scenario: "global-cap", Metric: "work", System: system, Base: base, Tasks: int64(f.capN), Seconds: secs, CPU: cpu}}, nil
}

// rateRun inserts cfg.flow.rateN no-op tasks under the rate limit and
// works them with one node. From the tasks' start times (executed_at, the
// database's clock, on which the limit is kept) it reports the rate after
// the first period (the bucket starts full, so the first period starts up
// to twice the limit) and the most starts in any period-long window,
// against the rule's bound, in all and after the first period.
func (b *bench) rateRun(ctx context.Context) ([]Result, error) {
	f := b.cfg.flow
	n := f.rateN
	h, dsn, err := b.flowHarness(ctx, "rate", true, 0, api.SubmitRequest{Behavior: flowRated}, n)
	if err != nil {
		return nil, err
	}
	defer h.close()
	_, cpu, err := b.workAll(ctx, h, sysStint, dsn, "rate", n, nil)
	if err != nil {
		return nil, err
	}
	rows, err := h.observer().Query(ctx, `SELECT executed_at FROM stint_task WHERE behavior = $1 ORDER BY executed_at`, string(flowRated))
	if err != nil {
		return nil, fmt.Errorf("read the start times: %w", err)
	}
	var starts []time.Time
	for rows.Next() {
		var t *time.Time
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the start times: %w", err)
		}
		if t == nil {
			rows.Close()
			return nil, errors.New("a task that succeeded has no executed_at")
		}
		starts = append(starts, *t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the start times: %w", err)
	}
	if len(starts) != n {
		return nil, fmt.Errorf("%d start times, want %d", len(starts), n)
	}
	rs := rateFigures(starts, int64(f.rateLimit), ratePeriod)
	note := fmt.Sprintf("rate limit %s per %s", num(int64(f.rateLimit)), ratePeriod)
	b.addCheck(Check{Scenario: "rate", System: sysStint, What: fmt.Sprintf("most starts in any %s", ratePeriod), Value: float64(rs.most), Bound: float64(rs.bound), Note: note})
	b.addCheck(Check{Scenario: "rate", System: sysStint, What: fmt.Sprintf("most starts in any %s after the first period", ratePeriod), Value: float64(rs.mostSteady), Bound: float64(rs.bound), Note: note})
	if rs.steadySecs <= 0 {
		return nil, fmt.Errorf("all %d tasks started within the first period, more than the rule allows", n)
	}
	return []Result{{Scenario: "rate", Metric: "rate after the first period", System: sysStint, Tasks: rs.steady, Seconds: rs.steadySecs,
		Bound: float64(f.rateLimit) / ratePeriod.Seconds(), CPU: cpu}}, nil
}

// rateStats are the rate scenario's figures of one run.
type rateStats struct {
	// steady counts the starts after the first period, over steadySecs,
	// from the first period's end to the last start.
	steady     int64
	steadySecs float64
	// most and mostSteady are the most starts in any window of a period,
	// in all and starting after the first period; bound is what the rule
	// allows in one: limit + limit*window/period.
	most, mostSteady, bound int
}

// rateFigures computes rateStats from the sorted start times of a run
// under a limit per period, its bucket full at the first start.
func rateFigures(starts []time.Time, limit int64, period time.Duration) rateStats {
	var rs rateStats
	rs.bound = int(2 * limit) // a window of one period
	if len(starts) == 0 {
		return rs
	}
	steadyFrom := starts[0].Add(period)
	i, _ := slices.BinarySearchFunc(starts, steadyFrom, func(t, target time.Time) int { return t.Compare(target) })
	for i < len(starts) && !starts[i].After(steadyFrom) {
		i++
	}
	rs.steady = int64(len(starts) - i)
	rs.steadySecs = starts[len(starts)-1].Sub(steadyFrom).Seconds()
	rs.most = mostInWindow(starts, period, starts[0])
	rs.mostSteady = mostInWindow(starts, period, steadyFrom)
	return rs
}

// fairRun inserts cfg.flow.fairN tasks of the big key and works them with
// one node, while (withSmall) the small key submits cfg.flow.fairRate
// tasks a second through the client until the big key's last task
// started: the big key's rate, and the small key's submit->start.
func (b *bench) fairRun(ctx context.Context, withSmall bool) ([]Result, error) {
	f := b.cfg.flow
	system, base := sysBigAlone, ""
	if withSmall {
		system, base = sysBigSmall, sysBigAlone
	}
	n := f.fairN
	h, dsn, err := b.flowHarness(ctx, "fair_"+system, true, f.fairWorkers, api.SubmitRequest{Behavior: flowFair, Params: keyParams(bigKey)}, n)
	if err != nil {
		return nil, err
	}
	defer h.close()
	stopProf := b.profile(sysStint, sanitize("fair "+system))
	b.resetStatements(ctx)
	win := begin()
	if err := h.start(ctx); err != nil {
		stopProf()
		return nil, err
	}
	var small *smallSubmitter
	if withSmall {
		small = startSmall(ctx, h, f.fairRate)
	}
	err = waitFor(ctx, b.cfg.timeout, func() bool { return h.flow.big.Load() >= int64(n) })
	end := time.Now()
	var sent []smallSubmit
	if small != nil {
		sent, err = small.stop(err)
	}
	if err == nil && len(sent) > 0 {
		err = waitFor(ctx, time.Minute, func() bool { return h.flow.keyedCount() >= len(sent) })
	}
	cpu := win.usage()
	stopProf()
	b.collectStatements(ctx, "fair "+system, dsn, time.Since(win.start))
	stopErr := h.stop(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	if stopErr != nil {
		return nil, stopErr
	}
	if err := checkCompleted(ctx, h.observer(), h.queries().completed, int64(n+len(sent))); err != nil {
		return nil, err
	}
	res := []Result{{Scenario: "fair", Metric: "big key: work", System: system, Base: base, Tasks: int64(n), Seconds: end.Sub(win.start).Seconds(), CPU: cpu}}
	if !withSmall {
		return res, nil
	}
	samples := make([]time.Duration, len(sent))
	var ahead int64
	for i, s := range sent {
		st, ok := h.flow.startOf(s.id)
		if !ok {
			return nil, fmt.Errorf("small-key task %s never started", s.id)
		}
		samples[i] = st.at.Sub(s.at)
		ahead = max(ahead, st.bigBefore-s.bigStored)
	}
	b.addCheck(Check{Scenario: "fair", System: system, What: "most big-key tasks started between a small-key task's submit and its start", Value: float64(ahead),
		Note: fmt.Sprintf("%d small-key tasks, %s big-key tasks queued", len(sent), num(int64(n)))})
	return append(res, Result{Scenario: "fair", Metric: "small key: submit->start", System: system, Tasks: int64(len(sent)), samples: samples, CPU: cpu}), nil
}

// smallSubmit is one submit of the small key.
type smallSubmit struct {
	id        api.TaskID
	at        time.Time // when the submit began
	bigStored int64     // big-key tasks started when the submit returned
}

// smallSubmitter submits the small key's tasks at a steady rate, each in a
// goroutine of its own, until stopped.
type smallSubmitter struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	sent   []smallSubmit
	errs   []error
}

// startSmall starts submitting rate small-key tasks a second through h's
// client, the first at once.
func startSmall(ctx context.Context, h *stintHarness, rate int) *smallSubmitter {
	// A submit under way when the submitter stops runs to its end (on
	// ctx), so that every task stored is one it counts.
	loop, cancel := context.WithCancel(ctx)
	s := &smallSubmitter{cancel: cancel}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		start := time.Now()
		for i := 0; ; i++ {
			sleep(loop, time.Until(start.Add(time.Duration(i)*time.Second/time.Duration(rate))))
			if loop.Err() != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				id := api.TaskID(fmt.Sprintf("small-%07d", i))
				at := time.Now()
				_, err := h.cli.Submit(ctx, api.SubmitRequest{Behavior: flowFair, ID: id, Params: keyParams(smallKey)})
				stored := h.flow.big.Load()
				s.mu.Lock()
				defer s.mu.Unlock()
				if err != nil {
					s.errs = append(s.errs, fmt.Errorf("submit %s: %w", id, err))
					return
				}
				s.sent = append(s.sent, smallSubmit{id: id, at: at, bigStored: stored})
			}()
		}
	}()
	return s
}

// stop stops submitting and returns the submits that stored their task,
// or err or the first submit's error.
func (s *smallSubmitter) stop(err error) ([]smallSubmit, error) {
	s.cancel()
	s.wg.Wait()
	if err == nil {
		err = errors.Join(s.errs...)
	}
	return s.sent, err
}
