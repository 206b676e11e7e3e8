package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// setupTelemetry installs the OpenTelemetry SDK as the global providers when the standard
// environment asks for an OTLP exporter (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / _METRICS_ENDPOINT) and
// OTEL_SDK_DISABLED is not "true". Off by default: the libraries then use
// OpenTelemetry's no-op providers. The exporters read the other OTEL_*
// variables (headers, protocol settings, OTEL_SERVICE_NAME) themselves.
// The returned function flushes and shuts the SDK down. A server that
// serves HTTP has a meter provider of its own, which also feeds /metrics
// (see newHTTPMetrics). name is the resource's service name.
func setupTelemetry(ctx context.Context, name string, stderr io.Writer) (shutdown func(context.Context) error, err error) {
	noop := func(context.Context) error { return nil }
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return noop, nil
	}
	traces := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	metrics := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != ""
	if !traces && !metrics {
		return noop, nil
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(name)))
	if err != nil {
		return noop, fmt.Errorf("telemetry resource: %w", err)
	}
	var shutdowns []func(context.Context) error
	if traces {
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return noop, fmt.Errorf("OTLP trace exporter: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		otel.SetTracerProvider(tp)
		shutdowns = append(shutdowns, tp.Shutdown)
	}
	if metrics {
		exp, err := otlpmetricgrpc.New(ctx)
		if err != nil {
			return noop, fmt.Errorf("OTLP metric exporter: %w", err)
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)), sdkmetric.WithResource(res))
		otel.SetMeterProvider(mp)
		shutdowns = append(shutdowns, mp.Shutdown)
	}
	otel.SetTextMapPropagator(propagation.TraceContext{})
	fmt.Fprintf(stderr, "%s: OpenTelemetry export on (OTLP/gRPC)\n", name)
	return func(ctx context.Context) error {
		var errs []error
		for _, s := range shutdowns {
			errs = append(errs, s(ctx))
		}
		return errors.Join(errs...)
	}, nil
}

// httpMetrics is the meter provider of a server that serves HTTP, and the
// handler of its GET /metrics.
type httpMetrics struct {
	provider *sdkmetric.MeterProvider
	handler  http.Handler
}

// meterProvider returns the provider for impl.ServerConfig.MeterProvider:
// nil (OpenTelemetry's global one) when there is no httpMetrics.
func (m *httpMetrics) meterProvider() metric.MeterProvider {
	if m == nil {
		return nil
	}
	return m.provider
}

// shutdown stops the provider's readers.
func (m *httpMetrics) shutdown() {
	if m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = m.provider.Shutdown(ctx)
}

// newHTTPMetrics builds the meter provider of a server whose HTTP server
// serves /metrics: OpenTelemetry's Prometheus exporter reads it when a
// scrape comes (with the Go runtime's and the process's collectors beside
// it), and, when the environment asks for OTLP metrics as setupTelemetry
// reads it, a periodic OTLP reader exports the same instruments. It
// returns nil when OTEL_SDK_DISABLED is "true": then nothing is served at
// /metrics. name is the resource's service name.
func newHTTPMetrics(ctx context.Context, name string) (*httpMetrics, error) {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return nil, nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The scope of every instrument is stint's: its label on every series
	// would tell nothing.
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("Prometheus exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(name)))
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(exp), sdkmetric.WithResource(res)}
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != "" {
		otlp, err := otlpmetricgrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTLP metric exporter: %w", err)
		}
		opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(otlp)))
	}
	return &httpMetrics{
		provider: sdkmetric.NewMeterProvider(opts...),
		handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}, nil
}
