package impl

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/stinthq/stint/api"
)

// observeLimits registers the gauges of flow control, which read limits
// once per collection (see gaugeCache): per rate limit (attribute
// rate_limit) the units used, summed over its keys, and the tasks waiting
// on it; per concurrency cap set at runtime (behavior, and group_key: empty
// for the behavior as a whole) the tasks running and waiting. The values
// are the cluster's, so every node reports the same ones: aggregate them
// across nodes with max, not sum. The rate limits named in declared (those
// the node's behaviors declare) report zeros until the database holds
// them, so that their series exist from the start.
func observeLimits(mp metric.MeterProvider, limits api.Limits, declared []string) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	// Instrument creation fails only on invalid names; ours are constants,
	// and a failed instrument is a working no-op.
	rateUsed, _ := m.Int64ObservableGauge("stint.rate_limit.used",
		metric.WithDescription("Units of a rate limit's budget spent, summed over its keys."))
	rateWaiting, _ := m.Int64ObservableGauge("stint.rate_limit.waiting",
		metric.WithDescription("Due tasks waiting on a rate limit."))
	capRunning, _ := m.Int64ObservableGauge("stint.concurrency_limit.running",
		metric.WithDescription("Tasks running under a concurrency cap."))
	capWaiting, _ := m.Int64ObservableGauge("stint.concurrency_limit.waiting",
		metric.WithDescription("Due tasks a concurrency cap holds back."))
	cached := &gaugeCache[limitsInfo]{what: "limits", read: readLimits(limits)}
	_, _ = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		info, err := cached.get(ctx)
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, l := range info.rate {
			var used int64
			for _, k := range l.Keys {
				used += k.Used
			}
			attrs := metric.WithAttributes(attribute.String("rate_limit", l.Name))
			o.ObserveInt64(rateUsed, used, attrs)
			o.ObserveInt64(rateWaiting, int64(l.Waiting), attrs)
			seen[l.Name] = true
		}
		for _, name := range declared {
			if !seen[name] {
				seen[name] = true
				attrs := metric.WithAttributes(attribute.String("rate_limit", name))
				o.ObserveInt64(rateUsed, 0, attrs)
				o.ObserveInt64(rateWaiting, 0, attrs)
			}
		}
		for _, c := range info.caps {
			attrs := metric.WithAttributes(attribute.String("behavior", string(c.Behavior)), attribute.String("group_key", c.Key))
			o.ObserveInt64(capRunning, int64(c.Running), attrs)
			o.ObserveInt64(capWaiting, int64(c.Waiting), attrs)
		}
		return nil
	}, rateUsed, rateWaiting, capRunning, capWaiting)
}

// limitsInfo is what the gauges of flow control read.
type limitsInfo struct {
	rate []api.RateLimitInfo
	caps []api.ConcurrencyInfo
}

// readLimits reads the rate limits and the concurrency caps.
func readLimits(limits api.Limits) func(context.Context) (limitsInfo, error) {
	return func(ctx context.Context) (limitsInfo, error) {
		rate, err := limits.RateLimits(ctx)
		if err != nil {
			return limitsInfo{}, err
		}
		caps, err := limits.ConcurrencyLimits(ctx)
		if err != nil {
			return limitsInfo{}, err
		}
		return limitsInfo{rate: rate, caps: caps}, nil
	}
}
