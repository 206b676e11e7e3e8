package main

// The flow-control scenarios: stint's rate limits, cluster-wide caps and
// fair share, each run against the same work without them (or, for the
// rate, against the rule's own bound). They are stint's features alone, so
// no peer runs them.

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// flowConfig is what the flow-control scenarios' flags set. Node processes
// get the part their behaviors need (addBehaviorFlags).
type flowConfig struct {
	limitsCost, globalCap, rate, fair bool // the scenarios picked

	costN       int           // limits-cost: tasks per run
	capN        int           // global-cap: tasks per run
	capNodes    int           // global-cap: node processes
	capWorkers  int           // global-cap: MaxWorkers of each node
	capMax      int           // global-cap: the cluster cap
	capSleep    time.Duration // global-cap: how long each task sleeps
	rateLimit   int           // rate: the limit, per second
	rateN       int           // rate: the backlog
	fairN       int           // fair: the big key's backlog
	fairRate    int           // fair: the small key's submits per second
	fairWorkers int           // fair: MaxWorkers of the node; 0 keeps --stint-workers
}

// defaultFlowConfig returns the flow-control flags' defaults: the sizes
// the scenarios are judged at.
func defaultFlowConfig() flowConfig {
	return flowConfig{
		costN:      100_000,
		capN:       10_000,
		capNodes:   4,
		capWorkers: 10,
		capMax:     40,
		capSleep:   100 * time.Millisecond,
		rateLimit:  1_000,
		rateN:      100_000,
		fairN:      100_000,
		fairRate:   10,
	}
}

// addFlags adds the flow-control scenarios' flags.
func (f *flowConfig) addFlags(fs *flag.FlagSet) {
	fs.BoolVar(&f.limitsCost, "limits-cost", false, "run the limits-cost scenario (stint only; not run by default)")
	fs.BoolVar(&f.globalCap, "global-cap", false, "run the global-cap scenario (stint only; not run by default)")
	fs.BoolVar(&f.rate, "rate", false, "run the rate scenario (stint only; not run by default)")
	fs.BoolVar(&f.fair, "fair", false, "run the fair scenario (stint only; not run by default)")
	fs.BoolFunc("flow", "run the four flow-control scenarios: limits-cost, global-cap, rate and fair", func(string) error {
		f.limitsCost, f.globalCap, f.rate, f.fair = true, true, true, true
		return nil
	})
	fs.IntVar(&f.costN, "limits-n", f.costN, "limits-cost: tasks per run")
	fs.IntVar(&f.capN, "global-cap-n", f.capN, "global-cap: tasks per run")
	fs.IntVar(&f.capNodes, "global-cap-nodes", f.capNodes, "global-cap: node processes")
	fs.IntVar(&f.capWorkers, "global-cap-workers", f.capWorkers, "global-cap: MaxWorkers of each node process")
	fs.IntVar(&f.rateN, "rate-n", f.rateN, "rate: tasks in the backlog")
	fs.IntVar(&f.fairN, "fair-n", f.fairN, "fair: the big key's backlog")
	fs.IntVar(&f.fairRate, "fair-rate", f.fairRate, "fair: the small key's submits per second")
	fs.IntVar(&f.fairWorkers, "fair-workers", 0, "fair: MaxWorkers of the node (0: --stint-workers, or stint's default); a node starts its claimed runs in turn, so a small-key task claimed behind a full node's runs waits for them")
	f.addBehaviorFlags(fs)
}

// addBehaviorFlags adds the flags the flow-control behaviors are built
// from, which node processes take too.
func (f *flowConfig) addBehaviorFlags(fs *flag.FlagSet) {
	fs.IntVar(&f.capMax, "global-cap-max", f.capMax, "global-cap: the cluster cap (spi.Policy.ClusterConcurrency)")
	fs.DurationVar(&f.capSleep, "global-cap-sleep", f.capSleep, "global-cap: how long each task sleeps")
	fs.IntVar(&f.rateLimit, "rate-limit", f.rateLimit, "rate: the rate limit, in tasks per second (its burst is as many)")
}

// behaviorArgs are the arguments of addBehaviorFlags for a node process.
func (f *flowConfig) behaviorArgs() []string {
	return []string{"--flow",
		"--global-cap-max", strconv.Itoa(f.capMax),
		"--global-cap-sleep", f.capSleep.String(),
		"--rate-limit", strconv.Itoa(f.rateLimit)}
}

// picked reports whether a flow-control scenario is picked.
func (f *flowConfig) picked() bool { return f.limitsCost || f.globalCap || f.rate || f.fair }

// check validates the flags; stint is whether stint is among the systems.
func (f *flowConfig) check(stint bool) error {
	for name, v := range map[string]int{"limits-n": f.costN, "global-cap-n": f.capN, "global-cap-nodes": f.capNodes,
		"global-cap-workers": f.capWorkers, "global-cap-max": f.capMax, "rate-limit": f.rateLimit, "rate-n": f.rateN,
		"fair-n": f.fairN, "fair-rate": f.fairRate} {
		if v <= 0 {
			return fmt.Errorf("--%s must be positive, not %d", name, v)
		}
	}
	if int64(f.rateN) <= 2*int64(f.rateLimit) {
		// The rule lets twice the limit start within the first period.
		return fmt.Errorf("--rate-n (%d) must be more than twice --rate-limit (%d), so that tasks start after the first period", f.rateN, f.rateLimit)
	}
	if f.fairWorkers < 0 {
		return fmt.Errorf("--fair-workers must not be negative, not %d", f.fairWorkers)
	}
	if f.capSleep <= 0 {
		return fmt.Errorf("--global-cap-sleep must be positive, not %s", f.capSleep)
	}
	if f.picked() && !stint {
		return errors.New("--limits-cost, --global-cap, --rate and --fair measure stint's flow control: --systems must include stint")
	}
	return nil
}

// The flow-control behaviors. Each takes flowParams; their tasks get ids
// of their own unless a submit names one.
const (
	// flowNoop is the no-op without limits, the runs' baseline.
	flowNoop api.BehaviorID = "bench.flow.noop"
	// flowLimited is the no-op under a rate limit and a cluster cap that
	// never bind.
	flowLimited api.BehaviorID = "bench.flow.limited"
	// flowSleep and flowCapped sleep flowConfig.capSleep, the latter
	// under the cluster cap flowConfig.capMax.
	flowSleep  api.BehaviorID = "bench.flow.sleep"
	flowCapped api.BehaviorID = "bench.flow.capped"
	// flowRated is the no-op under the rate limit rateLimitName.
	flowRated api.BehaviorID = "bench.flow.rated"
	// flowFair is the no-op whose claims take fair share between the
	// group keys of its params.
	flowFair api.BehaviorID = "bench.flow.fair"

	costLimitName = "bench.cost"
	rateLimitName = "bench.rate"
	// ratePeriod is the rate limit's period, and the window the rate
	// scenario counts starts in.
	ratePeriod = time.Second
	// neverBinds is the rate (per second) and cluster cap of flowLimited:
	// far above what any run reaches.
	neverBinds = 1_000_000_000
)

// fairKeys are the group keys of the fair scenario.
const bigKey, smallKey = "big", "small"

// flowParams are the params of the flow-control behaviors: Key is the
// task's group key.
type flowParams struct {
	Key string `json:"key,omitempty"`
}

// flowTask is a flow-control behavior: it sleeps (or not) and tells its
// recorder it ran.
type flowTask struct {
	id    api.BehaviorID
	pol   spi.Policy
	sleep time.Duration
	rec   *flowRecorder
}

func (f flowTask) Kind() api.Kind[flowParams, struct{}] {
	return api.Kind[flowParams, struct{}]{ID: f.id}
}
func (flowTask) TaskID(ids spi.IDs, _ flowParams) api.TaskID { return ids.Unique() }
func (flowTask) GroupKey(p flowParams) string                { return p.Key }
func (f flowTask) Policy() spi.Policy                        { return f.pol }
func (f flowTask) Run(ctx context.Context, rc spi.RunContext, p flowParams) (struct{}, error) {
	f.rec.started(rc.TaskID(), p.Key)
	if f.sleep <= 0 {
		return struct{}{}, nil
	}
	start := time.Now()
	if err := spi.Sleep(ctx, f.sleep); err != nil {
		return struct{}{}, err
	}
	f.rec.ran(start, time.Now())
	return struct{}{}, nil
}

// ratedTask is a flowTask whose every task uses one unit of a rate limit,
// with one budget for all.
type ratedTask struct {
	flowTask
	limit string
}

func (r ratedTask) RateUses(flowParams) []spi.RateUse { return []spi.RateUse{{Limit: r.limit}} }

// registerFlow registers the flow-control behaviors with f's settings.
func registerFlow(reg *spi.Registry, f flowConfig, rec *flowRecorder) error {
	second := func(limit int64) spi.Policy {
		return spi.Policy{RateLimits: []api.RateLimit{{Name: costLimitName, Limit: limit, Period: time.Second}}}
	}
	limited := second(neverBinds)
	limited.ClusterConcurrency = neverBinds
	rated := spi.Policy{RateLimits: []api.RateLimit{{Name: rateLimitName, Limit: int64(f.rateLimit), Period: ratePeriod}}}
	for _, b := range []spi.Behavior[flowParams, struct{}]{
		flowTask{id: flowNoop, rec: rec},
		ratedTask{flowTask{id: flowLimited, pol: limited, rec: rec}, costLimitName},
		flowTask{id: flowSleep, sleep: f.capSleep, rec: rec},
		flowTask{id: flowCapped, sleep: f.capSleep, pol: spi.Policy{ClusterConcurrency: f.capMax}, rec: rec},
		ratedTask{flowTask{id: flowRated, pol: rated, rec: rec}, rateLimitName},
		flowTask{id: flowFair, pol: spi.Policy{FairShare: true}, rec: rec},
	} {
		if err := spi.Register(reg, b); err != nil {
			return fmt.Errorf("register %s: %w", b.Kind().ID, err)
		}
	}
	return nil
}

// flowRecorder records what the flow-control behaviors ran: how many tasks
// of the big key started, when each other keyed task started and how many
// of the big key had started by then, and the spans of the sleeping runs
// (global-cap counts the runs at once across node processes from them).
type flowRecorder struct {
	big   atomic.Int64
	mu    sync.Mutex
	keyed map[api.TaskID]keyedStart
	spans []span
}

// keyedStart is the start of a task with a key other than the big one.
type keyedStart struct {
	at        time.Time
	bigBefore int64 // tasks of the big key started before it
}

// span is one run, from its start to its end, in Unix nanoseconds: node
// processes share the machine's clock.
type span struct{ start, end int64 }

func newFlowRecorder() *flowRecorder {
	return &flowRecorder{keyed: map[api.TaskID]keyedStart{}}
}

func (r *flowRecorder) started(id api.TaskID, key string) {
	if key == bigKey {
		r.big.Add(1)
		return
	}
	if key == "" {
		return
	}
	s := keyedStart{at: time.Now(), bigBefore: r.big.Load()}
	r.mu.Lock()
	if _, dup := r.keyed[id]; !dup {
		r.keyed[id] = s
	}
	r.mu.Unlock()
}

func (r *flowRecorder) ran(start, end time.Time) {
	r.mu.Lock()
	r.spans = append(r.spans, span{start.UnixNano(), end.UnixNano()})
	r.mu.Unlock()
}

// startOf returns the start of the keyed task id.
func (r *flowRecorder) startOf(id api.TaskID) (keyedStart, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.keyed[id]
	return s, ok
}

// keyedCount counts the keyed tasks started.
func (r *flowRecorder) keyedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.keyed)
}

// writeSpans writes the recorded spans as "span START END" lines, the
// child protocol's.
func (r *flowRecorder) writeSpans(w io.Writer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	bw := bufio.NewWriter(w)
	for _, s := range r.spans {
		fmt.Fprintf(bw, "span %d %d\n", s.start, s.end)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write the runs' spans: %w", err)
	}
	return nil
}

// parseSpan parses a "span START END" line.
func parseSpan(line string) (span, bool) {
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "span" {
		return span{}, false
	}
	a, err1 := strconv.ParseInt(f[1], 10, 64)
	b, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || b < a {
		return span{}, false
	}
	return span{a, b}, true
}

// mostAtOnce returns the most spans that overlap at any instant (a span
// ends before one starting at the same time begins).
func mostAtOnce(spans []span) int {
	type edge struct {
		t     int64
		delta int
	}
	edges := make([]edge, 0, 2*len(spans))
	for _, s := range spans {
		edges = append(edges, edge{s.start, 1}, edge{s.end, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if a.t != b.t {
			return cmp.Compare(a.t, b.t)
		}
		return a.delta - b.delta
	})
	most, now := 0, 0
	for _, e := range edges {
		now += e.delta
		most = max(most, now)
	}
	return most
}

// mostInWindow returns the most of the sorted times ts that fall in any
// window [t, t+w) whose start t is at or after from.
func mostInWindow(ts []time.Time, w time.Duration, from time.Time) int {
	most := 0
	j := 0
	for i, t := range ts {
		if t.Before(from) {
			continue
		}
		j = max(j, i)
		for j < len(ts) && ts[j].Before(t.Add(w)) {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

// submitAll submits n tasks of req, batch per SubmitMany call, through
// tasks.
func submitAll(ctx context.Context, tasks api.Tasks, req api.SubmitRequest, n, batch int) error {
	reqs := make([]api.SubmitRequest, min(n, batch))
	for i := range reqs {
		reqs[i] = req
	}
	return addChunks(ctx, n, batch, func(ctx context.Context, k int) error {
		if _, err := tasks.SubmitMany(ctx, reqs[:k]); err != nil {
			return fmt.Errorf("submit %d %s tasks: %w", k, req.Behavior, err)
		}
		return nil
	})
}

// keyParams returns the JSON params of a task of group key key.
func keyParams(key string) json.RawMessage {
	raw, _ := json.Marshal(flowParams{Key: key}) // cannot fail
	return raw
}

// Check is one run's figure held to a rule (or shown beside it): the flow
// scenarios' figures that matter in every run, not the median.
type Check struct {
	Scenario string `json:"scenario"`
	System   string `json:"system"`
	// Run counts the runs of the scenario and system, from 1.
	Run   int     `json:"run"`
	What  string  `json:"what"`
	Value float64 `json:"value"`
	// Bound is the most the rule allows; zero for a figure no rule bounds.
	Bound float64 `json:"bound,omitempty"`
	// Over is set when Value is above Bound.
	Over bool   `json:"over,omitempty"`
	Note string `json:"note,omitempty"`
}

// addCheck records a check of the run under way of scenario and system.
func (b *bench) addCheck(c Check) {
	c.Run = 1
	for _, o := range b.rep.Checks {
		if o.Scenario == c.Scenario && o.System == c.System && o.What == c.What {
			c.Run++
		}
	}
	c.Over = c.Bound > 0 && c.Value > c.Bound
	b.rep.Checks = append(b.rep.Checks, c)
}

// flowRatios fills the ratios of the rows measured against another row
// (Base) or a bound (Bound).
func (r *Report) flowRatios() {
	byKey := map[string]Result{}
	key := func(scenario, metric, system string) string { return scenario + "|" + metric + "|" + system }
	for _, x := range r.Results {
		if x.Error == "" {
			byKey[key(x.Scenario, x.Metric, x.System)] = x
		}
	}
	for i := range r.Results {
		x := &r.Results[i]
		if x.Error != "" || x.PerSec <= 0 {
			continue
		}
		if x.Bound > 0 {
			x.BoundRatio = x.PerSec / x.Bound
		}
		base, ok := byKey[key(x.Scenario, x.Metric, x.Base)]
		if x.Base == "" || !ok || base.PerSec <= 0 {
			continue
		}
		x.BaseRatio = x.PerSec / base.PerSec
		x.BaseRatioPerRun, x.BaseRatioMin = runRatios(x.PerRun, base.PerRun)
	}
}

// flowRatio renders a row's ratio to its base or bound, or "".
func (x Result) flowRatio() string {
	switch {
	case x.BaseRatio > 0 && len(x.BaseRatioPerRun) > 0:
		return fmt.Sprintf("÷ %s: %.2f× (runs %.2f–%.2f×)", x.Base, x.BaseRatio, x.BaseRatioMin, slices.Max(x.BaseRatioPerRun))
	case x.BaseRatio > 0:
		return fmt.Sprintf("÷ %s: %.2f×", x.Base, x.BaseRatio)
	case x.BoundRatio > 0 && len(x.PerRun) > 1:
		return fmt.Sprintf("÷ limit %s/s: %.2f× (runs %.2f–%.2f×)", num(int64(x.Bound)), x.BoundRatio, slices.Min(x.PerRun)/x.Bound, slices.Max(x.PerRun)/x.Bound)
	case x.BoundRatio > 0:
		return fmt.Sprintf("÷ limit %s/s: %.2f×", num(int64(x.Bound)), x.BoundRatio)
	}
	return ""
}

// writeChecks prints the checks, if any.
func (r *Report) writeChecks(w io.Writer) {
	if len(r.Checks) == 0 {
		return
	}
	fmt.Fprintln(w, "\nFlow-control checks, every run:")
	for _, c := range r.Checks {
		line := fmt.Sprintf("  %s, %s, run %d: %s: %s", c.Scenario, c.System, c.Run, c.What, num(int64(c.Value)))
		if c.Bound > 0 {
			line += fmt.Sprintf(" (rule: at most %s)", num(int64(c.Bound)))
		}
		if c.Note != "" {
			line += "; " + c.Note
		}
		if c.Over {
			line += "  ABOVE THE RULE"
		}
		fmt.Fprintln(w, line)
	}
}

// flowSummary describes the flow-control scenarios picked, for the report.
func (c config) flowSummary() (cost, capped, rate, fair string) {
	f := c.flow
	if f.limitsCost {
		cost = fmt.Sprintf("%s no-op tasks inserted, then worked by one node, their behavior naming a rate limit of %s/s and with a cluster cap of %s (neither binds), against the same without them",
			num(int64(f.costN)), num(neverBinds), num(neverBinds))
	}
	if f.globalCap {
		capped = fmt.Sprintf("%s tasks of %s inserted, then worked by %d node processes of %d workers each, with a cluster cap of %d (spi.Policy.ClusterConcurrency), against the same without it; until none is left",
			num(int64(f.capN)), f.capSleep, f.capNodes, f.capWorkers, f.capMax)
	}
	if f.rate {
		rate = fmt.Sprintf("%s no-op tasks inserted, then worked by one node under a rate limit of %s per %s (burst %s): the rate after the first period (start times: the tasks' executed_at, the database's clock), and the most starts in any %s (rule: %s + %s)",
			num(int64(f.rateN)), num(int64(f.rateLimit)), ratePeriod, num(int64(f.rateLimit)), ratePeriod, num(int64(f.rateLimit)), num(int64(f.rateLimit)))
	}
	if f.fair {
		workers := "stint's default MaxWorkers"
		if w := cmp.Or(f.fairWorkers, c.stintWorkers); w > 0 {
			workers = fmt.Sprintf("MaxWorkers %d", w)
		}
		fair = fmt.Sprintf("%s no-op tasks of group key %q inserted, then worked by one node (%s) with fair share while key %q submits %d tasks/s through a client: the small key's submit->start and the big key's rate (until its last task started), against the big key alone",
			num(int64(f.fairN)), bigKey, workers, smallKey, f.fairRate)
	}
	return cost, capped, rate, fair
}

// flowHarness opens stint with the flow-control behaviors (and a server
// of workers workers, 0 for --stint-workers, with server) on a fresh
// database named for label, and submits n tasks of req through its
// client.
func (b *bench) flowHarness(ctx context.Context, label string, server bool, workers int, req api.SubmitRequest, n int) (*stintHarness, string, error) {
	dsn, err := b.db.newDB(ctx, label)
	if err != nil {
		return nil, "", err
	}
	cfg := b.cfg
	if workers > 0 {
		cfg.stintWorkers = workers
	}
	h, err := newStint(ctx, dsn, cfg, b.log, stintOptions{server: server, client: true, flow: true})
	if err != nil {
		return nil, "", err
	}
	if err := submitAll(ctx, h.cli, req, n, b.cfg.batch); err != nil {
		h.close()
		return nil, "", err
	}
	return h, dsn, nil
}
