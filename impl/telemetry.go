package impl

import (
	"context"
	"sync"
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
type telemetry struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	// global is set when tracer comes from OpenTelemetry's global
	// provider, which may get an SDK at any time.
	global bool

	submitted, claimed, succeeded, failed, renewals metric.Int64Counter
	// takeovers counts the tasks of expired leases this node made due
	// again.
	takeovers    metric.Int64Counter
	claimSize    metric.Int64Histogram
	claimLatency metric.Float64Histogram

	perBehavior sync.Map // api.BehaviorID -> *behaviorTelemetry, built once
}

// behaviorTelemetry is what the instruments need of a behavior, built once:
// building an attribute set hashes it, and every string concatenation
// allocates.
type behaviorTelemetry struct {
	// add is the options of a counter's Add, a slice so that a call does
	// not allocate one for its variadic argument.
	add     []metric.AddOption
	runName string
}

// runSpanOptions start every run span: a run is its own trace, linked to
// its submitter.
var runSpanOptions = []trace.SpanStartOption{trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer)}

// observeServer registers the gauges of a server: the tasks it runs, and
// the queue lag (the age of the oldest due task), which is read from the
// database only when a reader collects it.
func observeServer(mp metric.MeterProvider, running func() int, lag func(context.Context) (time.Duration, error)) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	_, _ = m.Int64ObservableGauge("stint.tasks.running",
		metric.WithDescription("Tasks this node runs now."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(int64(running()))
			return nil
		}))
	_, _ = m.Float64ObservableGauge("stint.queue.lag", metric.WithUnit("s"),
		metric.WithDescription("How long the longest-waiting due task has been due."),
		metric.WithFloat64Callback(func(ctx context.Context, o metric.Float64Observer) error {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			d, err := lag(ctx)
			if err != nil {
				return err
			}
			o.Observe(d.Seconds())
			return nil
		}))
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
	t.submitted, _ = m.Int64Counter("stint.tasks.submitted", metric.WithDescription("Tasks submitted, by behavior."))
	t.claimed, _ = m.Int64Counter("stint.tasks.claimed", metric.WithDescription("Tasks claimed by this node, by behavior."))
	t.succeeded, _ = m.Int64Counter("stint.tasks.succeeded", metric.WithDescription("Runs that succeeded, by behavior."))
	t.failed, _ = m.Int64Counter("stint.tasks.failed", metric.WithDescription("Runs that failed, by behavior."))
	t.renewals, _ = m.Int64Counter("stint.lease.renewals", metric.WithDescription("Leases renewed by this node."))
	t.takeovers, _ = m.Int64Counter("stint.tasks.taken_over",
		metric.WithDescription("Tasks of expired leases (of nodes that died or stalled) this node made due again."))
	t.claimSize, _ = m.Int64Histogram("stint.claim.size", metric.WithDescription("Tasks per claim statement."))
	t.claimLatency, _ = m.Float64Histogram("stint.claim.duration", metric.WithUnit("s"), metric.WithDescription("Duration of claim statements."))
	return t
}

// behavior returns the options of a counter's Add naming behavior b.
func (t *telemetry) behavior(b api.BehaviorID) []metric.AddOption {
	return t.of(b).add
}

func (t *telemetry) of(b api.BehaviorID) *behaviorTelemetry {
	if bt, ok := t.perBehavior.Load(b); ok {
		return bt.(*behaviorTelemetry)
	}
	bt := &behaviorTelemetry{
		add:     []metric.AddOption{metric.WithAttributes(attribute.String("stint.behavior", string(b)))},
		runName: "stint.run " + string(b),
	}
	t.perBehavior.Store(b, bt)
	return bt
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
	ctx, span := t.tracer.Start(ctx, t.of(c.Behavior).runName, runSpanOptions...)
	if !span.IsRecording() {
		// No SDK, or not sampled: skip building what nobody records.
		return ctx, span
	}
	span.SetAttributes(
		attribute.String("stint.behavior", string(c.Behavior)),
		attribute.String("stint.task_id", string(c.ID)),
		attribute.Int("stint.attempt", c.Attempt),
		attribute.String("stint.node", node))
	if c.Trace != "" {
		link := trace.SpanContextFromContext(t.propagator.Extract(context.Background(), propagation.MapCarrier{"traceparent": c.Trace}))
		if link.IsValid() {
			span.AddLink(trace.Link{SpanContext: link})
		}
	}
	return ctx, span
}

// runEnded records how a run ended on its span and counters.
func (t *telemetry) runEnded(ctx context.Context, span trace.Span, c store.Completion, behavior api.BehaviorID) {
	switch c.Status {
	case api.StatusSuccess:
		t.succeeded.Add(ctx, 1, t.behavior(behavior)...)
		span.SetStatus(codes.Ok, "")
	case api.StatusFailure:
		t.failed.Add(ctx, 1, t.behavior(behavior)...)
		span.SetStatus(codes.Error, c.Error.Error())
	default:
		span.SetAttributes(attribute.Bool("stint.snoozed", true))
	}
	span.End()
}

// claimDone records a claim statement.
func (t *telemetry) claimDone(ctx context.Context, claimed []store.Claimed, took time.Duration) {
	t.claimSize.Record(ctx, int64(len(claimed)))
	t.claimLatency.Record(ctx, took.Seconds())
	per := map[api.BehaviorID]int64{}
	for _, c := range claimed {
		per[c.Behavior]++
	}
	for b, n := range per {
		t.claimed.Add(ctx, n, t.behavior(b)...)
	}
}

// tookOver counts the tasks of expired leases a takeover made due again.
func (t *telemetry) tookOver(ctx context.Context, tasks int) {
	t.takeovers.Add(ctx, int64(tasks))
}
