package impl_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store/postgres"
)

// BenchmarkSingleSubmitClientAndServer measures single submits of no-op
// tasks (given ids, as a caller's) from a client on its own pool and from
// the server working them, which starts each at once: the two alternate
// one by one, so that a shared machine's noise falls on both alike, and
// the medians of each side are reported (client-p50-µs, server-p50-µs)
// with their ratio (server/client). In "due" the client's tasks are due
// at once, so each wakes a claim of the server, which holds the free slots
// while it is in the database; in "delayed" they are due in an hour and
// wake no claim, which leaves the two submit paths alone.
func BenchmarkSingleSubmitClientAndServer(b *testing.B) {
	for _, delay := range []time.Duration{0, time.Hour} {
		name := "due"
		if delay > 0 {
			name = "delayed"
		}
		b.Run(name, func(b *testing.B) { benchSingleSubmits(b, delay) })
	}
}

// benchSingleSubmits is BenchmarkSingleSubmitClientAndServer with the
// client's tasks due after delay.
func benchSingleSubmits(b *testing.B, delay time.Duration) {
	ctx := context.Background()
	dsn := pgtest.New(b)
	st, err := postgres.Open(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	cst, err := postgres.Open(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer cst.Close()
	srv, reg := startNoop(ctx, b, st)
	defer srv.Stop(ctx)
	cli, err := impl.NewClient(cst, impl.ClientConfig{Registry: reg})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	sides := []api.Tasks{cli, srv}
	took := [2][]time.Duration{}
	b.ResetTimer()
	for i := range b.N {
		for k, via := range sides {
			req := api.SubmitRequest{Behavior: noopKind.ID, ID: api.TaskID(fmt.Sprint("t", i, "-", k))}
			if via == api.Tasks(cli) {
				req.Delay = delay
			}
			start := time.Now()
			if _, err := via.Submit(ctx, req); err != nil {
				b.Fatal(err)
			}
			took[k] = append(took[k], time.Since(start))
		}
	}
	b.StopTimer()
	p50 := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Microseconds())
	}
	c, s := p50(took[0]), p50(took[1])
	b.ReportMetric(c, "client-p50-µs")
	b.ReportMetric(s, "server-p50-µs")
	b.ReportMetric(s/c, "server/client")
}
