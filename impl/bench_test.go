package impl_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// startNoop starts a server at its defaults on st that runs the no-op
// behavior, and returns it with its registry. The caller stops it.
func startNoop(ctx context.Context, b *testing.B, st *postgres.Store) (*impl.Server, *spi.Registry) {
	b.Helper()
	reg := spi.NewRegistry()
	spi.MustRegister[struct{}, struct{}](reg, noop{})
	srv, err := impl.NewServer(st, impl.ServerConfig{Registry: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		b.Fatal(err)
	}
	return srv, reg
}

// BenchmarkSubmitAndRun measures the throughput of no-op tasks: submitted
// with SubmitMany in batches of 1,000 while one server works them.
func BenchmarkSubmitAndRun(b *testing.B) {
	ctx := context.Background()
	st, err := postgres.Open(ctx, pgtest.New(b))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	srv, _ := startNoop(ctx, b, st)
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
	reportDone(ctx, b, st, start)
}

// BenchmarkRunningSlotsMemory reports the resident memory of this process
// (test binary, server and client) with 1,000 tasks running at once.
func BenchmarkRunningSlotsMemory(b *testing.B) {
	ctx := context.Background()
	st, err := postgres.Open(ctx, pgtest.New(b))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	reg := spi.NewRegistry()
	spi.MustRegister[struct{}, struct{}](reg, block{})
	srv, err := impl.NewServer(st, impl.ServerConfig{Registry: reg, MaxWorkers: 1000, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer srv.Stop(ctx)
	for range b.N {
		reqs := make([]api.SubmitRequest, 1000)
		for i := range reqs {
			reqs[i] = api.SubmitRequest{Behavior: blockKind.ID}
		}
		if _, err := srv.SubmitMany(ctx, reqs); err != nil {
			b.Fatal(err)
		}
		// Wait for the runs themselves, not their slots: a run whose slot
		// is taken may not have picked up the channel that releases it.
		for blockWaiting.Load() < 1000 {
			time.Sleep(10 * time.Millisecond)
		}
		runtime.GC()
		b.ReportMetric(float64(rssBytes(b))/(1<<20), "MiB-RSS")
		releaseBlocked()
		for srv.Running() > 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

var (
	blockKind = api.Kind[struct{}, struct{}]{ID: "bench.block"}
	unblock   = make(chan struct{})
	blockMu   sync.Mutex
	// blockWaiting counts the runs of bench.block waiting to be released.
	blockWaiting atomic.Int64
)

// block is bench.block: it runs until released.
type block struct{}

func (block) Kind() api.Kind[struct{}, struct{}]        { return blockKind }
func (block) TaskID(ids spi.IDs, _ struct{}) api.TaskID { return ids.Unique() }
func (block) Run(ctx context.Context, _ spi.RunContext, _ struct{}) (struct{}, error) {
	blockMu.Lock()
	ch := unblock
	blockWaiting.Add(1)
	blockMu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
	return struct{}{}, nil
}

func releaseBlocked() {
	blockMu.Lock()
	close(unblock)
	unblock = make(chan struct{})
	blockWaiting.Store(0)
	blockMu.Unlock()
}

// rssBytes reads this process's resident set size.
func rssBytes(b *testing.B) int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// limitedNoop is a no-op behavior under a rate limit and a cluster cap set
// high enough never to bind.
type limitedNoop struct{ noop }

var limitedNoopKind = api.Kind[struct{}, struct{}]{ID: "bench.limited"}

func (limitedNoop) Kind() api.Kind[struct{}, struct{}] { return limitedNoopKind }
func (limitedNoop) Policy() spi.Policy {
	return spi.Policy{ClusterConcurrency: 100_000,
		RateLimits: []api.RateLimit{{Name: "bench", Limit: 10_000_000, Period: time.Second}}}
}
func (limitedNoop) RateUses(struct{}) []spi.RateUse { return []spi.RateUse{{Limit: "bench"}} }

// BenchmarkLimitsCost measures the cost of flow control when it does not
// bind: a burn-down of b.N no-op tasks, submitted before the server
// starts, plain (no limits) and limited (a rate limit of 10M/s and a
// cluster cap of 100,000). Compare the two sub-benchmarks' tasks/s.
func BenchmarkLimitsCost(b *testing.B) {
	for _, limited := range []bool{false, true} {
		name := "plain"
		if limited {
			name = "limited"
		}
		b.Run(name, func(b *testing.B) { benchBurnDown(b, limited) })
	}
}

func benchBurnDown(b *testing.B, limited bool) {
	ctx := context.Background()
	st, err := postgres.Open(ctx, pgtest.New(b))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	reg := spi.NewRegistry()
	id := noopKind.ID
	if limited {
		id = limitedNoopKind.ID
		spi.MustRegister[struct{}, struct{}](reg, limitedNoop{})
	} else {
		spi.MustRegister[struct{}, struct{}](reg, noop{})
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	cl, err := impl.NewClient(st, impl.ClientConfig{Registry: reg, Logger: logger})
	if err != nil {
		b.Fatal(err)
	}
	for left := b.N; left > 0; {
		n := min(left, 1000)
		reqs := make([]api.SubmitRequest, n)
		for i := range reqs {
			reqs[i] = api.SubmitRequest{Behavior: id}
		}
		if _, err := cl.SubmitMany(ctx, reqs); err != nil {
			b.Fatal(err)
		}
		left -= n
	}
	srv, err := impl.NewServer(st, impl.ServerConfig{Registry: reg, Logger: logger})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	if err := srv.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer srv.Stop(ctx)
	reportDone(ctx, b, st, start)
}

// reportDone waits until b.N tasks succeeded and reports their rate since
// start.
func reportDone(ctx context.Context, b *testing.B, st *postgres.Store, start time.Time) {
	for {
		var done int
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM stint_task WHERE status = 'success'`).Scan(&done); err != nil {
			b.Fatal(err)
		}
		if done == b.N {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling for the end of the run, in a benchmark
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
}
