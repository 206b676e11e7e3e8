package impl

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/stinthq/stint/api"
)

// limitsMaxAge is how long a read of the limits serves the gauges, so that
// several metric readers collecting at once cost the database one read.
const limitsMaxAge = time.Second

// observeLimits registers the gauges of flow control, which read limits
// when a reader collects them: per rate limit (attribute stint.rate_limit)
// the units used, summed over its keys, and the tasks waiting on it; per
// concurrency cap set at runtime (stint.behavior, stint.group_key: empty
// for the behavior as a whole) the tasks running and waiting. The values
// are the cluster's, so every server reports the same ones, as with
// stint.queue.lag.
func observeLimits(mp metric.MeterProvider, limits api.Limits) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	// Instrument creation fails only on invalid names; ours are constants,
	// and a failed instrument is a working no-op.
	rateUsed, _ := m.Int64ObservableGauge("stint.rate_limit.used", metric.WithUnit("{unit}"),
		metric.WithDescription("Units of a rate limit's budget spent, summed over its keys."))
	rateWaiting, _ := m.Int64ObservableGauge("stint.rate_limit.waiting", metric.WithUnit("{task}"),
		metric.WithDescription("Due tasks waiting on a rate limit."))
	capRunning, _ := m.Int64ObservableGauge("stint.concurrency_limit.running", metric.WithUnit("{task}"),
		metric.WithDescription("Tasks running under a concurrency cap."))
	capWaiting, _ := m.Int64ObservableGauge("stint.concurrency_limit.waiting", metric.WithUnit("{task}"),
		metric.WithDescription("Due tasks a concurrency cap holds back."))
	r := &limitsReader{limits: limits}
	_, _ = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		rate, caps, err := r.read(ctx)
		if err != nil {
			return err
		}
		for _, l := range rate {
			var used int64
			for _, k := range l.Keys {
				used += k.Used
			}
			attrs := metric.WithAttributes(attribute.String("stint.rate_limit", l.Name))
			o.ObserveInt64(rateUsed, used, attrs)
			o.ObserveInt64(rateWaiting, int64(l.Waiting), attrs)
		}
		for _, c := range caps {
			attrs := metric.WithAttributes(attribute.String("stint.behavior", string(c.Behavior)), attribute.String("stint.group_key", c.Key))
			o.ObserveInt64(capRunning, int64(c.Running), attrs)
			o.ObserveInt64(capWaiting, int64(c.Waiting), attrs)
		}
		return nil
	}, rateUsed, rateWaiting, capRunning, capWaiting)
}

// limitsReader reads the limits for the gauges, reusing a read for
// limitsMaxAge.
type limitsReader struct {
	limits api.Limits

	mu   sync.Mutex
	at   time.Time
	rate []api.RateLimitInfo
	caps []api.ConcurrencyInfo
}

// read returns the limits, read again when the last read is older than
// limitsMaxAge. Concurrent callers share one read.
func (r *limitsReader) read(ctx context.Context) ([]api.RateLimitInfo, []api.ConcurrencyInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && time.Since(r.at) < limitsMaxAge {
		return r.rate, r.caps, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rate, err := r.limits.RateLimits(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("read rate limits for their gauges: %w", err)
	}
	caps, err := r.limits.ConcurrencyLimits(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("read concurrency limits for their gauges: %w", err)
	}
	r.rate, r.caps, r.at = rate, caps, time.Now()
	return rate, caps, nil
}
