package impl_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// sleeper is bench.sleep: each run sleeps 10 ms, under a MaxConcurrency
// of its own.
type sleeper struct{ max int }

var sleepKind = api.Kind[struct{}, struct{}]{ID: "bench.sleep"}

func (sleeper) Kind() api.Kind[struct{}, struct{}]        { return sleepKind }
func (sleeper) TaskID(ids spi.IDs, _ struct{}) api.TaskID { return ids.Unique() }
func (s sleeper) Policy() spi.Policy                      { return spi.Policy{MaxConcurrency: s.max} }
func (sleeper) Run(ctx context.Context, _ spi.RunContext, _ struct{}) (struct{}, error) {
	return struct{}{}, spi.Sleep(ctx, 10*time.Millisecond)
}

// BenchmarkCappedBehavior runs b.N tasks of 10 ms, stored before the server
// starts, under a MaxConcurrency of 8 and of 64, and reports the tasks per
// second and their share of what the cap allows (cap / 10 ms).
func BenchmarkCappedBehavior(b *testing.B) {
	for _, limit := range []int{8, 64} {
		b.Run(fmt.Sprint("max=", limit), func(b *testing.B) {
			ctx := context.Background()
			reg := spi.NewRegistry()
			spi.MustRegister[struct{}, struct{}](reg, sleeper{max: limit})
			reqs := make([]api.SubmitRequest, b.N)
			for i := range reqs {
				reqs[i] = api.SubmitRequest{Behavior: sleepKind.ID}
			}
			st, srv := benchServer(b, reg)
			if _, err := srv.SubmitMany(ctx, reqs); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			if err := srv.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer srv.Stop(ctx)
			reportDone(ctx, b, st, start)
			rate := float64(b.N) / time.Since(start).Seconds()
			b.ReportMetric(rate/(float64(limit)/0.010), "of-ideal")
		})
	}
}
