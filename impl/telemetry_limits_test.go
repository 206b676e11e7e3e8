package impl_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// metered is test.metered: its runs end at once, each after taking one
// unit of the rate limit meteredLimit under the key of its params.
type metered struct{}

const meteredLimit = "test-metered"

var meteredKind = api.Kind[KeyParams, struct{}]{ID: "test.metered"}

func (metered) Kind() api.Kind[KeyParams, struct{}]        { return meteredKind }
func (metered) TaskID(ids spi.IDs, _ KeyParams) api.TaskID { return ids.Unique() }
func (metered) Run(context.Context, spi.RunContext, KeyParams) (struct{}, error) {
	return struct{}{}, nil
}
func (metered) RateUses(p KeyParams) []spi.RateUse {
	return []spi.RateUse{{Limit: meteredLimit, Key: p.Key}}
}

// limitGauges reads the int64 gauges of reader, by name and then by their
// attributes written as "k=v,k=v".
func limitGauges(t *testing.T, reader *sdkmetric.ManualReader) map[string]map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			g, ok := m.Data.(metricdata.Gauge[int64])
			if !ok {
				continue
			}
			out[m.Name] = map[string]int64{}
			for _, dp := range g.DataPoints {
				attrs := ""
				for i, kv := range dp.Attributes.ToSlice() {
					if i > 0 {
						attrs += ","
					}
					attrs += fmt.Sprintf("%s=%s", kv.Key, kv.Value.Emit())
				}
				out[m.Name][attrs] = dp.Value
			}
		}
	}
	return out
}

// The gauges of flow control read the limits: per rate limit the units
// used and the tasks waiting, per concurrency cap the tasks running and
// waiting.
func TestTelemetryLimitGauges(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	b := &blocker{kind: api.Kind[KeyParams, struct{}]{ID: "test.capped"}, log: newRunLog()}
	reg := spi.NewRegistry()
	spi.MustRegister[KeyParams, struct{}](reg, b)
	spi.MustRegister[KeyParams, struct{}](reg, metered{})
	srv := e.server("gauged", time.Minute, func(cfg *impl.ServerConfig) { cfg.Registry, cfg.MeterProvider = reg, mp })

	// A rate limit of one unit an hour, and a cap of one running task:
	// of two tasks each, one starts and one waits.
	require.NoError(t, srv.SetRateLimit(e.ctx, api.RateLimit{Name: meteredLimit, Limit: 1, Period: time.Hour}))
	require.NoError(t, srv.SetConcurrencyLimit(e.ctx, api.ConcurrencyLimit{Behavior: b.kind.ID, Max: 1}))
	e.submitKeys(srv, meteredKind.ID, "acme", "acme")
	blocked := e.submitKeys(srv, b.kind.ID, "one", "two")
	t.Cleanup(func() {
		// Halt the blocked runs rather than wait for them at the stop.
		for _, id := range blocked {
			_ = srv.Remove(context.Background(), id)
		}
	})

	want := map[string]map[string]int64{
		"stint.rate_limit.used":           {"rate_limit=" + meteredLimit: 1},
		"stint.rate_limit.waiting":        {"rate_limit=" + meteredLimit: 1},
		"stint.concurrency_limit.running": {"behavior=test.capped,group_key=": 1},
		"stint.concurrency_limit.waiting": {"behavior=test.capped,group_key=": 1},
	}
	var got map[string]map[string]int64
	waitFor(t, time.Minute, "the gauges to show one running and one waiting of each", func() bool {
		got = limitGauges(t, reader)
		for name, points := range want {
			for attrs, v := range points {
				if got[name][attrs] != v {
					return false
				}
			}
		}
		return true
	})
	for name := range want {
		require.Len(t, got[name], 1, "%s has one point per limit: %v", name, got[name])
	}

	// A removed limit is no longer reported.
	require.NoError(t, srv.RemoveRateLimit(e.ctx, meteredLimit))
	waitFor(t, time.Minute, "the removed rate limit to go", func() bool {
		got = limitGauges(t, reader)
		return len(got["stint.rate_limit.used"]) == 0
	})
}
