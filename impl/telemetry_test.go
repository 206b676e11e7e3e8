package impl_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/store"
)

func TestRunSpanLinksToSubmitSpanAndCountersMatch(t *testing.T) {
	t.Parallel()
	e := setup(t)
	submitSpans, runSpans := tracetest.NewInMemoryExporter(), tracetest.NewInMemoryExporter()
	submitTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(submitSpans))
	runTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(runSpans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))

	srv := e.server("traced", 5*time.Second, func(c *impl.ServerConfig) { c.TracerProvider, c.MeterProvider = runTP, mp })
	client, err := impl.NewClient(e.st, impl.ClientConfig{Registry: testRegistry(e.pool, "client", time.Second), TracerProvider: submitTP, MeterProvider: mp})
	require.NoError(t, err)
	t.Cleanup(client.Close)

	ctx, parent := submitTP.Tracer("test").Start(e.ctx, "caller")
	const n = 5
	var futures []*api.Future[WorkResult]
	for i := range n {
		f, err := api.Submit(ctx, client, workKind, WorkParams{Key: string(rune('a' + i))})
		require.NoError(t, err)
		futures = append(futures, f)
	}
	parent.End()
	for _, f := range futures {
		_, err := f.Await(e.ctx)
		require.NoError(t, err)
	}

	submits := map[string]bool{} // span ids of the submit spans
	for _, s := range submitSpans.GetSpans() {
		if s.Name == "stint.submit test.work" {
			require.Equal(t, parent.SpanContext().TraceID(), s.SpanContext.TraceID(), "the submit span is in the caller's trace")
			submits[s.SpanContext.SpanID().String()] = true
		}
	}
	require.Len(t, submits, n)
	waitFor(t, 10*time.Second, "the run spans", func() bool { return len(runSpans.GetSpans()) >= n })
	for _, s := range runSpans.GetSpans() {
		require.Equal(t, "stint.run test.work", s.Name)
		require.Len(t, s.Links, 1)
		require.True(t, submits[s.Links[0].SpanContext.SpanID().String()], "the run links to its submit")
		require.NotEqual(t, parent.SpanContext().TraceID(), s.SpanContext.TraceID(), "a run is its own trace")
	}

	sums, gauges := collectMetrics(t, reader)
	require.Contains(t, gauges, "stint.queue.lag")
	require.Zero(t, gauges["stint.queue.lag"], "nothing is due")
	require.Equal(t, int64(n), sums["stint.client.submits"])
	waitFor(t, 10*time.Second, "the finishes to be counted", func() bool {
		sums, _ = collectMetrics(t, reader)
		return sums["stint.task.finishes{outcome=success}"] == n
	})
	require.Equal(t, int64(n), sums["stint.task.starts"])
	require.Zero(t, sums["stint.task.finishes{outcome=failure}"])
	require.Zero(t, sums["stint.task.retries"])
	_ = srv
}

// A server configured with no TracerProvider follows OpenTelemetry's global
// one: no run spans before an SDK is set, run spans after, with no restart.
// Not parallel: it sets the process-wide provider.
func TestRunSpansFollowTheGlobalProvider(t *testing.T) {
	if _, set := otel.GetTracerProvider().(*sdktrace.TracerProvider); set {
		// OpenTelemetry's global provider delegates to the first SDK set
		// and is that SDK from then on: with -count above 1, the state
		// this test starts from cannot be made again in this process.
		t.Skip("an earlier run in this process set the global TracerProvider")
	}
	e := setup(t)
	srv := e.server("global-traced", 5*time.Second)

	e.run(srv, WorkParams{Key: "before-sdk"})

	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	f, _ := e.run(srv, WorkParams{Key: "after-sdk"})
	runs := func() (ids []string) {
		for _, s := range spans.GetSpans() {
			if s.Name == "stint.run test.work" {
				for _, a := range s.Attributes {
					if a.Key == "stint.task_id" {
						ids = append(ids, a.Value.AsString())
					}
				}
			}
		}
		return ids
	}
	waitFor(t, 10*time.Second, "the run span", func() bool { return len(runs()) > 0 })
	require.Equal(t, []string{string(f.ID())}, runs(), "only the run after the SDK was set has a span")
}

// collectMetrics reads every int64 sum, by name and also by name and
// outcome ("name{outcome=success}") or reason ("name{reason=signal}"), and
// the largest value of each float64 gauge, by name.
func collectMetrics(t *testing.T, reader *sdkmetric.ManualReader) (sums map[string]int64, gauges map[string]float64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	sums, gauges = map[string]int64{}, map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					sums[m.Name] += dp.Value
					for _, attr := range []attribute.Key{"outcome", "reason"} {
						if o, ok := dp.Attributes.Value(attr); ok {
							sums[m.Name+"{"+string(attr)+"="+o.AsString()+"}"] += dp.Value
						}
					}
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					if state, ok := dp.Attributes.Value("state"); ok {
						gauges[m.Name+"{state="+state.AsString()+"}"] = float64(dp.Value)
					}
				}
			case metricdata.Gauge[float64]:
				for i, dp := range d.DataPoints {
					if i == 0 || dp.Value > gauges[m.Name] {
						gauges[m.Name] = dp.Value
					}
				}
			}
		}
	}
	return sums, gauges
}

// The takeover counter counts the tasks of an expired lease that a server
// made due again; the queue-lag gauge reads the age of the oldest due task.
func TestTelemetryTakeoverCounterAndQueueLagGauge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))

	// A node that claims with a one-second lease and never renews it.
	sub, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "orphan"}))
	require.NoError(t, err)
	got, err := e.st.Claim(e.ctx, store.ClaimRequest{Node: "vanished", Limit: 10,
		Behaviors: []store.BehaviorLease{{Behavior: workKind.ID, Lease: time.Second}}})
	require.NoError(t, err)
	require.Len(t, got, 1)

	// Paused, the server takes the task over but does not run it, so it
	// stays due and the queue lag grows.
	require.NoError(t, c.Pause(e.ctx, workKind.ID))
	e.server("heir", 5*time.Second, func(cfg *impl.ServerConfig) { cfg.MeterProvider = mp })
	waitFor(t, 30*time.Second, "the takeover to be counted", func() bool {
		sums, _ := collectMetrics(t, reader)
		return sums["stint.takeovers"] == 1
	})
	task, err := c.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, task.Status, "the taken-over task is due again")
	waitFor(t, 10*time.Second, "a queue lag", func() bool {
		_, gauges := collectMetrics(t, reader)
		return gauges["stint.queue.lag"] > 0
	})

	require.NoError(t, c.Resume(e.ctx, workKind.ID))
	_, err = c.Await(e.ctx, sub.ID)
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the queue lag to drop to zero", func() bool {
		_, gauges := collectMetrics(t, reader)
		return gauges["stint.queue.lag"] == 0
	})
	sums, _ := collectMetrics(t, reader)
	require.Equal(t, int64(1), sums["stint.takeovers"], "one task was taken over, once")
}

// TestWorkflowIsOneTrace: the runs of a workflow's nodes are spans of the
// trace its submit started, children of the submit span; the workflow
// gauge counts it by state.
func TestWorkflowIsOneTrace(t *testing.T) {
	t.Parallel()
	e := setup(t)
	submitSpans, runSpans := tracetest.NewInMemoryExporter(), tracetest.NewInMemoryExporter()
	submitTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(submitSpans))
	runTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(runSpans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e.server("traced", 5*time.Second, func(c *impl.ServerConfig) { c.TracerProvider, c.MeterProvider = runTP, mp })
	client, err := impl.NewClient(e.st, impl.ClientConfig{Registry: testRegistry(e.pool, "client", time.Second), TracerProvider: submitTP})
	require.NoError(t, err)
	t.Cleanup(client.Close)

	sub, err := client.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-traced", Nodes: []api.WorkflowNode{
		spanNode("a", 0), spanNode("b", 0, "a"), spanNode("c", 0, "a"),
	}})
	require.NoError(t, err)
	_, err = client.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	var submit sdktrace.ReadOnlySpan
	for _, s := range submitSpans.GetSpans().Snapshots() {
		if s.Name() == "stint.submit stint.workflow" {
			submit = s
		}
	}
	require.NotNil(t, submit, "the workflow's submit has a span")
	waitFor(t, 10*time.Second, "the node run spans", func() bool { return len(runSpans.GetSpans()) >= 3 })
	nodes := 0
	for _, s := range runSpans.GetSpans() {
		if s.Name != "stint.run test.plain" {
			continue
		}
		nodes++
		require.Equal(t, submit.SpanContext().TraceID(), s.SpanContext.TraceID(), "a node's run is in the workflow's trace")
		require.Equal(t, submit.SpanContext().SpanID(), s.Parent.SpanID(), "a child of the workflow's submit")
	}
	require.Equal(t, 3, nodes)
	waitFor(t, time.Minute, "the workflow gauge", func() bool {
		_, gauges := collectMetrics(t, reader)
		return gauges["stint.workflows{state=succeeded}"] == 1 && gauges["stint.workflows{state=running}"] == 0
	})
}

// TestWaitsOnTheRunSpanAndCounted: a run that ends asleep on a signal has
// the wait's reason, topic and longest wait on its span, as attributes and
// an event; the run the signal wakes has none; stint.task.waits counts
// the wait by reason, from zero.
func TestWaitsOnTheRunSpanAndCounted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	srv := e.server("waits", 5*time.Second, func(c *impl.ServerConfig) { c.TracerProvider, c.MeterProvider = tp, mp })
	sums, _ := collectMetrics(t, reader)
	require.Contains(t, sums, "stint.task.waits{reason=signal}", "counted from zero")
	require.Zero(t, sums["stint.task.waits"])

	f, err := api.Submit(e.ctx, srv, collectKind, collectParams{Topic: "paid", N: 1})
	require.NoError(t, err)
	awaitSleep(t, srv, f.ID(), "paid")
	waitFor(t, 10*time.Second, "the wait to be counted", func() bool {
		sums, _ = collectMetrics(t, reader)
		return sums["stint.task.waits{reason=signal}"] == 1
	})
	require.Equal(t, int64(1), sums["stint.task.waits"], "one wait, of one reason")
	require.NoError(t, srv.Signal(e.ctx, f.ID(), "paid", 42))
	_, err = f.Await(e.ctx)
	require.NoError(t, err)

	var runs tracetest.SpanStubs
	waitFor(t, 10*time.Second, "both run spans", func() bool {
		runs = slices.DeleteFunc(spans.GetSpans(), func(s tracetest.SpanStub) bool { return s.Name != "stint.run test.collect" })
		return len(runs) >= 2
	})
	require.Len(t, runs, 2)
	attrs := func(kvs []attribute.KeyValue) map[attribute.Key]any {
		out := map[attribute.Key]any{}
		for _, kv := range kvs {
			out[kv.Key] = kv.Value.AsInterface()
		}
		return out
	}
	asleep, woken := attrs(runs[0].Attributes), attrs(runs[1].Attributes)
	require.Equal(t, "signal", asleep["stint.wait.reason"])
	require.Equal(t, "paid", asleep["stint.wait.topic"])
	require.Equal(t, time.Hour.Seconds(), asleep["stint.wait.max"])
	require.Len(t, runs[0].Events, 1)
	require.Equal(t, "stint.wait", runs[0].Events[0].Name)
	require.Equal(t, "paid", attrs(runs[0].Events[0].Attributes)["stint.wait.topic"])
	require.Equal(t, string(f.ID()), woken["stint.task_id"])
	require.NotContains(t, woken, attribute.Key("stint.wait.reason"), "the run the signal woke ended")
	require.Empty(t, runs[1].Events)
	waitFor(t, 10*time.Second, "the finish to be counted", func() bool {
		sums, _ = collectMetrics(t, reader)
		return sums["stint.task.finishes{outcome=success}"] == 1
	})
	require.Equal(t, int64(1), sums["stint.task.waits"], "the run the signal woke did not sleep")
}
