package impl_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// bigParams are the params of test.big: a blob, and the round whose gate
// its run waits at.
type bigParams struct {
	Blob  string `json:"blob"`
	Round string `json:"round"`
}

var bigKind = api.Kind[bigParams, string]{ID: "test.big"}

// bigGates holds a channel per round of bigRounds, closed when the
// round's runs may return.
var bigGates sync.Map

// big is test.big: tasks whose runs wait for their round's gate and
// return their blob.
type big struct{}

func (big) Kind() api.Kind[bigParams, string]          { return bigKind }
func (big) TaskID(ids spi.IDs, _ bigParams) api.TaskID { return ids.Unique() }
func (big) Policy() spi.Policy                         { return spi.Policy{MaxParamsBytes: 2 << 20} }
func (big) Run(ctx context.Context, _ spi.RunContext, p bigParams) (string, error) {
	g, _ := bigGates.Load(p.Round)
	select {
	case <-ctx.Done():
		return "", context.Cause(ctx)
	case <-g.(chan struct{}):
		return p.Blob, nil
	}
}

// heapRound is what one round of bigRounds measured, in bytes: the heap
// after a collection once the round's ends were recorded, and the most
// the heap held (live objects and garbage not collected yet) during it.
type heapRound struct{ after, peak uint64 }

// bigRounds runs rounds of n tasks of test.big of size bytes each on a
// server node of this process, whose slots are n: each round submits
// them, waits until they all run at once, lets them return their params
// as their result, and waits for their ends to be recorded. It returns
// the heap before the first round, after a collection, and each round's
// figures.
func bigRounds(tb testing.TB, rounds, n, size int) (before uint64, out []heapRound) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	tb.Cleanup(cancel)
	st, err := postgres.Open(ctx, pgtest.New(tb))
	require.NoError(tb, err)
	tb.Cleanup(st.Close)
	reg := spi.NewRegistry()
	spi.MustRegister[bigParams, string](reg, big{})
	srv, err := impl.NewServer(st, impl.ServerConfig{Node: "n1", Registry: reg, MaxWorkers: n,
		PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))})
	require.NoError(tb, err)
	require.NoError(tb, srv.Start(ctx))
	tb.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Stop(sctx)
	})
	count := func(status string) int {
		var c int
		require.NoError(tb, st.Pool().QueryRow(ctx, `SELECT count(*) FROM stint_task WHERE status = $1`, status).Scan(&c))
		return c
	}
	waitUntil := func(what string, cond func() bool) {
		for deadline := time.Now().Add(10 * time.Minute); !cond(); time.Sleep(50 * time.Millisecond) {
			require.False(tb, time.Now().After(deadline), "timed out waiting for %s", what)
		}
	}
	before = heapAfterGC()
	for round := range rounds {
		name := fmt.Sprintf("%s#%d", tb.Name(), round)
		g := make(chan struct{})
		bigGates.Store(name, g)
		var peak atomic.Uint64
		stop := sampleHeap(&peak)
		const chunk = 10 // a submit's batch: the client's own memory stays small beside the node's
		for sent := 0; sent < n; sent += chunk {
			reqs := make([]api.SubmitRequest, min(chunk, n-sent))
			for i := range reqs {
				reqs[i] = api.SubmitRequest{Behavior: bigKind.ID, Params: mustJSON(bigParams{Blob: strings.Repeat("x", size), Round: name})}
			}
			_, err := srv.SubmitMany(ctx, reqs)
			require.NoError(tb, err)
		}
		waitUntil("all of the round's tasks to run", func() bool { return count("running") == n })
		close(g)
		waitUntil("all of the round's tasks to end", func() bool { return count("success") == n*(round+1) })
		stop()
		out = append(out, heapRound{after: heapAfterGC(), peak: peak.Load()})
		tb.Logf("round %d: heap after %d MB, peak %d MB", round+1, out[round].after>>20, out[round].peak>>20)
	}
	return before, out
}

// heapAfterGC returns the bytes of heap objects after a collection.
func heapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// sampleHeap records in peak the most bytes of heap objects (live or not
// collected yet) it sees every millisecond until stop is called.
func sampleHeap(peak *atomic.Uint64) (stop func()) {
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(s)
			peak.Store(max(peak.Load(), s[0].Value.Uint64()))
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() { close(done); <-finished }
}

// TestANodeKeepsNoPayloadsAfterItsRuns: round after round of tasks of
// half a megabyte running together, a node keeps no more than a fraction
// of a round's payloads once their ends are recorded. Its store's
// connections each kept the encoded parameters of their last statement
// (a batch of results), and the completer its last batches' results: the
// heap after each round grew by as much, and with it the heap the garbage
// collector let grow before collecting. The test measures its own heap:
// it runs alone (not in parallel), and other tests' leftovers count
// against its bound.
func TestANodeKeepsNoPayloadsAfterItsRuns(t *testing.T) {
	const rounds, n, size = 3, 30, 512 << 10
	before, out := bigRounds(t, rounds, n, size)
	for i, r := range out {
		require.Less(t, int64(r.after)-int64(before), int64(n*size/2),
			"round %d: the heap after the round kept more than half of a round's payloads (%d MB before the first round, %d MB after)",
			i+1, before>>20, r.after>>20)
	}
}

// BenchmarkBigRounds reports the figures of rounds of 200 tasks of a
// megabyte on a node of this process (see bigRounds): the heap after a
// collection once each round ended, and its peak during the round, in
// MB. b.N is not used: run it with -benchtime 1x.
func BenchmarkBigRounds(b *testing.B) {
	const rounds, n, size = 4, 200, 1 << 20
	before, out := bigRounds(b, rounds, n, size)
	b.ReportMetric(float64(before>>20), "MB-heap-before")
	for i, r := range out {
		b.ReportMetric(float64(r.after>>20), fmt.Sprintf("MB-heap-after-%d", i+1))
		b.ReportMetric(float64(r.peak>>20), fmt.Sprintf("MB-peak-%d", i+1))
	}
}
