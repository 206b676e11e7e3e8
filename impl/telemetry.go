package impl

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// instrumentationName names stint's tracer and meter.
const instrumentationName = "github.com/stinthq/stint"

// telemetry holds the OpenTelemetry instruments. The engine uses only the
// OpenTelemetry API; with no SDK configured (the default) every call is a
// no-op.
//
// The metric names are chosen so that OpenTelemetry's Prometheus exporter
// serves them under Prometheus' conventions: dots become underscores, a
// unit of seconds adds _seconds, and a counter adds _total. Their
// attributes (behavior, status, outcome, node) become the labels.
type telemetry struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	// global is set when tracer comes from OpenTelemetry's global
	// provider, which may get an SDK at any time.
	global bool

	submitted, renewals metric.Int64Counter
	// takeovers counts the tasks of expired leases this node made due
	// again, observed as stint.takeovers: observed, it is exported (as
	// zero) before the first takeover.
	takeovers atomic.Int64
	// delays counts the task starts a rate limit delayed.
	delays       metric.Int64Counter
	claimSize    metric.Int64Histogram
	claimLatency metric.Float64Histogram

	perBehavior sync.Map // api.BehaviorID -> *behaviorTelemetry, built once
}

// behaviorTelemetry is what the instruments need of a behavior, built once:
// building an attribute set hashes it, and every string concatenation
// allocates. It also counts the behavior's runs: the run counters are
// observed from these counts when a reader collects, and the history
// records them, so that a run costs an atomic add, not an instrument call.
type behaviorTelemetry struct {
	id api.BehaviorID
	// add is the options of a counter's Add, a slice so that a call does
	// not allocate one for its variadic argument.
	add     []metric.AddOption
	runName string
	// observe, succeeded and failed are the attributes of the observed
	// counters: the behavior, and the behavior with each outcome.
	observe, succeeded, failed metric.ObserveOption

	// ends counts this process's runs: started, and ended with their end
	// recorded, by outcome; retries are the failed runs whose task runs
	// again.
	ends struct {
		starts, succeeded, failed, retried atomic.Int64
	}
	// waits counts the runs of this process that ended asleep, with their
	// end recorded, by reason (waitReasons); waitAttrs are the attributes
	// of each.
	waits     [len(waitReasons)]atomic.Int64
	waitAttrs [len(waitReasons)]metric.ObserveOption
	// recorded are the counts of ends the history has; only the history
	// loop uses them.
	recorded struct {
		succeeded, failed, retried int64
	}
}

// waitReasons are the reasons a run ends asleep, holding no worker until
// what it waits for comes (or its longest wait passes): a signal of a
// topic (spi.WaitForSignal, reason api.WaitSignal), the end of its
// children (spi.WaitForChildren) or of other tasks (spi.WaitForTasks), or
// a time (spi.Snooze).
var waitReasons = [...]string{api.WaitSignal, "children", "tasks", "snooze"}

// waitReason returns the index in waitReasons of the reason completion c
// sleeps for, false when c does not sleep.
func waitReason(c store.Completion) (int, bool) {
	switch {
	case c.Status != api.StatusScheduled:
		return 0, false
	case c.WaitSignal != "":
		return 0, true
	case c.WaitChildren:
		return 1, true
	case c.WaitTasks:
		return 2, true
	}
	return 3, true
}

// runSpanOptions start every run span: a run is its own trace, linked to
// its submitter.
var runSpanOptions = []trace.SpanStartOption{trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer)}

// workflowNodeSpanOptions start the run spans of workflow nodes, children
// of the workflow's submit: one trace per workflow.
var workflowNodeSpanOptions = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

// taskStatuses are the statuses the task gauge reports for every behavior,
// zero or not, so that a chart of one shows a zero rather than a gap.
var taskStatuses = []api.Status{api.StatusWaiting, api.StatusScheduled, api.StatusRunning, api.StatusHeld, api.StatusSuccess, api.StatusFailure}

// workflowStates are the states the workflow gauge reports, zero or not,
// each from the statuses of the workflows' own tasks: a workflow runs
// until its task records its outcome, a success or a failure (cancelled
// workflows count as failed there).
var workflowStates = []struct {
	state    api.WorkflowState
	statuses []api.Status
}{
	{api.WorkflowRunning, []api.Status{api.StatusWaiting, api.StatusHeld, api.StatusScheduled, api.StatusRunning}},
	{api.WorkflowSucceeded, []api.Status{api.StatusSuccess}},
	{api.WorkflowFailed, []api.Status{api.StatusFailure}},
}

// statsMaxAge is how long the gauges reuse a snapshot of the statistics,
// so that one collection reads them once, and so does a second reader
// (Prometheus and OTLP) that collects at the same moment.
const statsMaxAge = time.Second

// observeServer registers the gauges of a server: the tasks this node runs
// (labelled with its node id), and, read from the database once per
// collection when a reader collects, the cluster's tasks per behavior and
// status, its due backlog and its queue lag (how long the longest-waiting
// due task of each behavior has been due). behaviors are reported even
// with no tasks. Every node reports the cluster's gauges alike: aggregate
// them across nodes with max, not sum.
func observeServer(mp metric.MeterProvider, node string, behaviors []api.BehaviorID, running func() int, stats func(context.Context) (store.Stats, error)) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	nodeAttr := metric.WithAttributes(attribute.String("node", node))
	_, _ = m.Int64ObservableGauge("stint.running_tasks",
		metric.WithDescription("Tasks this node runs now."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(int64(running()), nodeAttr)
			return nil
		}))
	tasks, _ := m.Int64ObservableGauge("stint.tasks",
		metric.WithDescription("Tasks in the database, by behavior and status (the cluster's, read from the database)."))
	backlog, _ := m.Int64ObservableGauge("stint.due_backlog",
		metric.WithDescription("Tasks due now and waiting for a worker, by behavior (the cluster's)."))
	lag, _ := m.Float64ObservableGauge("stint.queue.lag", metric.WithUnit("s"),
		metric.WithDescription("How long the longest-waiting due task of each behavior has been due (the cluster's)."))
	workflows, _ := m.Int64ObservableGauge("stint.workflows",
		metric.WithDescription("Workflows in the database, by state: running, succeeded or failed (cancelled ones count as failed)."))
	cached := &gaugeCache[store.Stats]{what: "stats", read: stats}
	_, _ = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		st, err := cached.get(ctx)
		if err != nil {
			return err
		}
		counts := map[api.BehaviorID]map[api.Status]int64{}
		for _, b := range behaviors {
			counts[b] = map[api.Status]int64{}
		}
		for _, c := range st.Counts {
			if counts[c.Behavior] == nil {
				counts[c.Behavior] = map[api.Status]int64{}
			}
			counts[c.Behavior][c.Status] += c.Count
		}
		due := map[api.BehaviorID]store.DueCount{}
		for _, d := range st.Due {
			due[d.Behavior] = d
		}
		for b, byStatus := range counts {
			battr := attribute.String("behavior", string(b))
			for _, status := range taskStatuses {
				o.ObserveInt64(tasks, byStatus[status], metric.WithAttributes(battr, attribute.String("status", string(status))))
			}
			d := due[b]
			o.ObserveInt64(backlog, d.Count, metric.WithAttributes(battr))
			o.ObserveFloat64(lag, d.OldestAge.Seconds(), metric.WithAttributes(battr))
		}
		for _, ws := range workflowStates {
			var n int64
			for _, status := range ws.statuses {
				n += counts[api.WorkflowBehavior][status]
			}
			o.ObserveInt64(workflows, n, metric.WithAttributes(attribute.String("state", string(ws.state))))
		}
		return nil
	}, tasks, backlog, lag, workflows)
}

// gaugeCache reuses what read returns for statsMaxAge, so that gauges
// reading it in one collection, or in collections of two readers at once,
// cost the database one read. Concurrent callers share one read.
type gaugeCache[T any] struct {
	// what names what read reads, for its errors.
	what string
	read func(context.Context) (T, error)

	mu   sync.Mutex
	at   time.Time
	last T
}

func (c *gaugeCache[T]) get(ctx context.Context) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < statsMaxAge {
		return c.last, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := c.read(ctx)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("read %s for the gauges: %w", c.what, err)
	}
	c.at, c.last = time.Now(), v
	return v, nil
}

// defaultTracerProvider is OpenTelemetry's global provider as it is before
// any SDK is set: its spans record nothing. otel.SetTracerProvider replaces
// what otel.GetTracerProvider returns.
var defaultTracerProvider = otel.GetTracerProvider()

func newTelemetry(tp trace.TracerProvider, mp metric.MeterProvider) *telemetry {
	global := tp == nil
	if global {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	t := &telemetry{tracer: tp.Tracer(instrumentationName), propagator: propagation.TraceContext{}, global: global}
	// Instrument creation fails only on invalid names; ours are constants,
	// and a failed instrument is a working no-op.
	t.submitted, _ = m.Int64Counter("stint.client.submits",
		metric.WithDescription("Tasks this process submitted through its own client, by behavior: not those other processes submitted, which stint.tasks counts in the database."))
	t.renewals, _ = m.Int64Counter("stint.lease.renewals", metric.WithDescription("Leases renewed by this node."))
	t.delays, _ = m.Int64Counter("stint.task.delays",
		metric.WithDescription("Task starts a rate limit delayed (each time a claim moved a task to when its limit admits it), by behavior."))
	t.claimSize, _ = m.Int64Histogram("stint.claim.size", metric.WithDescription("Tasks per claim statement."),
		metric.WithExplicitBucketBoundaries(0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000))
	t.claimLatency, _ = m.Float64Histogram("stint.claim.duration", metric.WithUnit("s"), metric.WithDescription("Duration of claim statements."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
	starts, _ := m.Int64ObservableCounter("stint.task.starts", metric.WithDescription("Runs this node started (claimed or started locally), by behavior."))
	waits, _ := m.Int64ObservableCounter("stint.task.waits",
		metric.WithDescription("Runs of this node that ended asleep, holding no worker until what they wait for comes, by behavior and reason: "+
			"signal (spi.WaitForSignal), children (spi.WaitForChildren), tasks (spi.WaitForTasks) or snooze (spi.Snooze)."))
	finishes, _ := m.Int64ObservableCounter("stint.task.finishes",
		metric.WithDescription("Runs this node ended with their end recorded, by behavior and outcome (success, failure)."))
	retries, _ := m.Int64ObservableCounter("stint.task.retries",
		metric.WithDescription("Failed runs of this node whose task runs again, by behavior."))
	takeovers, _ := m.Int64ObservableCounter("stint.takeovers",
		metric.WithDescription("Tasks of expired leases (of nodes that died or stalled) this node made due again."))
	_, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(takeovers, t.takeovers.Load())
		t.perBehavior.Range(func(_, v any) bool {
			bt := v.(*behaviorTelemetry)
			o.ObserveInt64(starts, bt.ends.starts.Load(), bt.observe)
			o.ObserveInt64(finishes, bt.ends.succeeded.Load(), bt.succeeded)
			o.ObserveInt64(finishes, bt.ends.failed.Load(), bt.failed)
			o.ObserveInt64(retries, bt.ends.retried.Load(), bt.observe)
			for i := range bt.waits {
				o.ObserveInt64(waits, bt.waits[i].Load(), bt.waitAttrs[i])
			}
			return true
		})
		return nil
	}, starts, finishes, retries, takeovers, waits)
	return t
}

// zeroFrom makes the node's counters report zeros from the start, before
// their first use: the lease renewals, and for each of behaviors (those
// the node runs) the runs started, ended and retried, the delays and the
// submits.
func (t *telemetry) zeroFrom(ctx context.Context, behaviors []api.BehaviorID) {
	t.renewals.Add(ctx, 0)
	for _, b := range behaviors {
		t.delays.Add(ctx, 0, t.behavior(b)...)
		t.submitted.Add(ctx, 0, t.behavior(b)...)
	}
}

// behavior returns the options of a counter's Add naming behavior b.
func (t *telemetry) behavior(b api.BehaviorID) []metric.AddOption {
	return t.of(b).add
}

func (t *telemetry) of(b api.BehaviorID) *behaviorTelemetry {
	if bt, ok := t.perBehavior.Load(b); ok {
		return bt.(*behaviorTelemetry)
	}
	battr := attribute.String("behavior", string(b))
	bt := &behaviorTelemetry{
		id:        b,
		add:       []metric.AddOption{metric.WithAttributes(battr)},
		runName:   "stint.run " + string(b),
		observe:   metric.WithAttributes(battr),
		succeeded: metric.WithAttributes(battr, attribute.String("outcome", "success")),
		failed:    metric.WithAttributes(battr, attribute.String("outcome", "failure")),
	}
	for i, reason := range waitReasons {
		bt.waitAttrs[i] = metric.WithAttributes(battr, attribute.String("reason", reason))
	}
	v, _ := t.perBehavior.LoadOrStore(b, bt)
	return v.(*behaviorTelemetry)
}

// startSubmit starts the span of a submit and returns the traceparent to
// store with the task, unless the request brings its own.
func (t *telemetry) startSubmit(ctx context.Context, behavior api.BehaviorID, n int) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, "stint.submit "+string(behavior), trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("stint.behavior", string(behavior)), attribute.Int("stint.tasks", n)))
}

// traceparent returns the W3C traceparent of ctx's span, or "".
func (t *telemetry) traceparent(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	t.propagator.Inject(ctx, carrier)
	return carrier.Get("traceparent")
}

// runStarted starts the span of a run, linked to the submitter's span through
// the stored traceparent. A run is its own trace: it may happen long after
// the submit, many times.
func (t *telemetry) runStarted(ctx context.Context, c store.Claimed, node string) (context.Context, trace.Span) {
	if t.global && otel.GetTracerProvider() == defaultTracerProvider {
		// No SDK: the span would be a new root that records nothing and
		// carries no context, yet building it took a tenth of a no-op
		// run's CPU.
		return ctx, trace.SpanFromContext(context.Background())
	}
	opts := runSpanOptions
	if c.Trace != "" && c.ParentID != "" && strings.HasPrefix(string(c.ID), string(c.ParentID)+"/") {
		// A workflow's node: its runs belong to the workflow's one trace,
		// as children of the submit that stored the workflow.
		ctx = t.propagator.Extract(ctx, propagation.MapCarrier{"traceparent": c.Trace})
		opts = workflowNodeSpanOptions
	}
	ctx, span := t.tracer.Start(ctx, t.of(c.Behavior).runName, opts...)
	if !span.IsRecording() {
		// No SDK, or not sampled: skip building what nobody records.
		return ctx, span
	}
	span.SetAttributes(
		attribute.String("stint.behavior", string(c.Behavior)),
		attribute.String("stint.task_id", string(c.ID)),
		attribute.Int("stint.attempt", c.Attempt),
		attribute.String("stint.node", node))
	if c.Version > 0 {
		span.SetAttributes(attribute.Int("stint.behavior.version", c.Version))
	}
	if c.Trace != "" && len(opts) == len(runSpanOptions) {
		link := trace.SpanContextFromContext(t.propagator.Extract(context.Background(), propagation.MapCarrier{"traceparent": c.Trace}))
		if link.IsValid() {
			span.AddLink(trace.Link{SpanContext: link})
		}
	}
	return ctx, span
}

// resumedStep sets the attribute stint.step on the span of a run c of a
// behavior that keeps steps (spi.Policy.KeepSteps) and resumes from one:
// the number of its task's last step, read only when the span records and
// the run has progress. A read that fails leaves it out.
func (t *telemetry) resumedStep(ctx context.Context, span trace.Span, st store.Store, c store.Claimed) {
	if c.Progress == nil || !span.IsRecording() {
		return
	}
	if n, err := st.LastStep(ctx, c.ID); err == nil && n > 0 {
		span.SetAttributes(attribute.Int("stint.step", n))
	}
}

// runEnded records how a run ended on its span. A run that ends asleep
// gets the attributes stint.wait.reason (see waitReasons), stint.wait.topic
// for a signal and stint.wait.max (its longest wait, in seconds), and an
// event stint.wait with them: the task's next run, once what it waits for
// comes, is the wake.
func (t *telemetry) runEnded(span trace.Span, c store.Completion) {
	switch c.Status {
	case api.StatusSuccess:
		span.SetStatus(codes.Ok, "")
	case api.StatusFailure:
		span.SetStatus(codes.Error, c.Error.Error())
	default:
		span.SetAttributes(attribute.Bool("stint.snoozed", true))
		if i, ok := waitReason(c); ok && span.IsRecording() {
			attrs := []attribute.KeyValue{attribute.String("stint.wait.reason", waitReasons[i]),
				attribute.Float64("stint.wait.max", c.Delay.Seconds())}
			if c.WaitSignal != "" {
				attrs = append(attrs, attribute.String("stint.wait.topic", c.WaitSignal))
			}
			span.SetAttributes(attrs...)
			span.AddEvent("stint.wait", trace.WithAttributes(attrs...))
		}
	}
	span.End()
}

// ended counts a run whose end was recorded.
func (bt *behaviorTelemetry) ended(c store.Completion) {
	if i, ok := waitReason(c); ok {
		bt.waits[i].Add(1)
	}
	switch c.Status {
	case api.StatusSuccess:
		bt.ends.succeeded.Add(1)
	case api.StatusFailure:
		bt.ends.failed.Add(1)
		if c.Again {
			bt.ends.retried.Add(1)
		}
	}
}

// claimDone records a claim statement.
func (t *telemetry) claimDone(ctx context.Context, claimed []store.Claimed, took time.Duration) {
	t.claimSize.Record(ctx, int64(len(claimed)))
	t.claimLatency.Record(ctx, took.Seconds())
}

// delayed counts the starts of behavior's tasks a claim delayed.
func (t *telemetry) delayed(ctx context.Context, n int, behavior api.BehaviorID) {
	if n > 0 {
		t.delays.Add(ctx, int64(n), t.behavior(behavior)...)
	}
}

// tookOver counts the tasks of expired leases a takeover made due again.
func (t *telemetry) tookOver(tasks int) {
	t.takeovers.Add(int64(tasks))
}
