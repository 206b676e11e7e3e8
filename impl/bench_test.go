package impl_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

type noop struct{}

var noopKind = api.Kind[struct{}, struct{}]{ID: "bench.noop"}

func (noop) Kind() api.Kind[struct{}, struct{}]                              { return noopKind }
func (noop) TaskID(ids spi.IDs, _ struct{}) api.TaskID                       { return ids.Unique() }
func (noop) Run(context.Context, spi.RunContext, struct{}) (struct{}, error) { return struct{}{}, nil }

// BenchmarkSubmitAndRun measures the throughput of no-op tasks: submitted
// with SubmitMany in batches of 1,000 while one server works them.
func BenchmarkSubmitAndRun(b *testing.B) {
	ctx := context.Background()
	st, err := postgres.Open(ctx, pgtest.New(b))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	reg := spi.NewRegistry()
	spi.MustRegister[struct{}, struct{}](reg, noop{})
	srv, err := impl.NewServer(st, impl.ServerConfig{Registry: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer srv.Stop(ctx)

	b.ResetTimer()
	start := time.Now()
	for left := b.N; left > 0; {
		n := min(left, 1000)
		reqs := make([]api.SubmitRequest, n)
		for i := range reqs {
			reqs[i] = api.SubmitRequest{Behavior: noopKind.ID}
		}
		if _, err := srv.SubmitMany(ctx, reqs); err != nil {
			b.Fatal(err)
		}
		left -= n
	}
	for {
		var done int
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM stint_task WHERE status = 'success'`).Scan(&done); err != nil {
			b.Fatal(err)
		}
		if done == b.N {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
}
