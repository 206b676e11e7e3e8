package replication

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// rotationLog records the engine's rotation ticks that stopped runs (its
// log line), with their local time.
type rotationLog struct {
	slog.Handler
	mu    *sync.Mutex
	ticks *[]tick
}

type tick struct {
	at      time.Time
	stopped int
}

func (h rotationLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "stint: rotation stopped runs for waiting tasks" {
		tk := tick{at: time.Now()}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "stopped" {
				tk.stopped = int(a.Value.Int64())
			}
			return true
		})
		h.mu.Lock()
		*h.ticks = append(*h.ticks, tk)
		h.mu.Unlock()
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h rotationLog) Enabled(context.Context, slog.Level) bool { return true }

// TestRotationGivesEveryContinuousReplicationItsTurn runs 3 x max_jobs
// continuous replications on one node with max_jobs 2, max_churn 3, a
// half-second interval and a two-second minimum run time, while every
// source keeps changing: at most 2 run at once, each gets several turns
// and resumes from its checkpoint, all targets end equal to their sources,
// and the starts and stops within each rotation interval never exceed
// max_churn.
func TestRotationGivesEveryContinuousReplicationItsTurn(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const (
		jobs     = 6
		maxJobs  = 2
		maxChurn = 3
		interval = 500 * time.Millisecond
		// A turn first opens two connections, reads both catalogs and
		// takes the replication's lock: 0.2 to 0.8 s beside two busy
		// cores, more in CI. A turn shorter than that set-up and a batch
		// copies nothing, turn after turn (its batch is cancelled
		// half-written), and the targets never catch up: two seconds
		// leave every turn time to copy.
		minRunTime = 2 * time.Second
	)
	var mu sync.Mutex
	var ticks []tick
	var starts []time.Time
	running, most := 0, 0
	resumed := map[api.TaskID][]int64{} // per task, the sequence each turn resumed from
	cfg := testConfig(e.st.Pool())
	cfg.Rotation = spi.Rotation{MaxRunning: maxJobs, MaxChurn: maxChurn, Interval: interval, MinRunTime: minRunTime}
	cfg.hook = func(_ context.Context, event string, id api.TaskID, n int64) {
		mu.Lock()
		defer mu.Unlock()
		switch event {
		case "run":
			starts = append(starts, time.Now())
			running++
			most = max(most, running)
		case "start":
			resumed[id] = append(resumed[id], n)
		case "end":
			running--
		}
	}
	cfg.Logger = e.logger()
	reg := spi.NewRegistry()
	require.NoError(t, Register(reg, cfg))
	srv, err := impl.NewServer(e.st, impl.ServerConfig{Node: "node", Registry: reg, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(rotationLog{Handler: e.logger().Handler(), mu: &mu, ticks: &ticks})})
	require.NoError(t, err)

	var writers []*writer
	var ids []api.TaskID
	for i := range jobs {
		table := fmt.Sprint("items_", i)
		e.makeTables(table, 2000)
		writers = append(writers, e.startWriter(table, 2000, 20*time.Millisecond))
	}
	began := time.Now()
	require.NoError(t, srv.Start(e.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	for i := range jobs {
		ids = append(ids, submit(t, e.ctx, srv, e.params(fmt.Sprint("items_", i)), true).ID())
	}
	// Turns first: on a busy machine a turn may end before its run copied
	// anything (the copy slows, the rotation's clock does not), so turns
	// and progress are waited for one after the other. A turn costs two
	// connections and a look at both catalogs, which a loaded machine
	// stretches to seconds: the deadline is generous, and a pass does not
	// wait for it.
	waitFor(t, 3*time.Minute, "every replication to get three turns", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if len(resumed[id]) < 3 {
				return false
			}
		}
		return true
	})
	for _, w := range writers {
		w.halt(t)
	}
	waitFor(t, 90*time.Second, "every target to catch up", func() bool {
		for i := range jobs {
			table := fmt.Sprint("items_", i)
			if !e.caughtUp(srv, ids[i], table, "", table) {
				return false
			}
		}
		return true
	})
	// The rotation goes on: each replication's next turn resumes from the
	// progress its earlier turns checkpointed, past where its second began.
	waitFor(t, 90*time.Second, "every replication to resume from progress made on its turns", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if seqs := resumed[id]; seqs[len(seqs)-1] <= seqs[1] {
				return false
			}
		}
		return true
	})
	require.NoError(t, srv.Stop(e.ctx))
	took := time.Since(began)

	mu.Lock()
	defer mu.Unlock()
	require.LessOrEqual(t, most, maxJobs, "at most max_jobs replications run at once")
	// Churn, by the replicator's rule: a rotation tick stops at most
	// max_churn runs and starts as many waiting tasks in their place, so
	// the stops at a tick plus the starts (claims) after it stay within
	// twice max_churn per interval. Ticks that stopped nothing
	// are not logged, so a window between two logged ticks may span
	// several intervals: at most its length / interval of them.
	require.NotEmpty(t, ticks, "the rotation stopped runs")
	total := 0
	bounds := append([]time.Time{began}, func() []time.Time {
		var at []time.Time
		for _, tk := range ticks {
			at = append(at, tk.at)
		}
		return at
	}()...)
	for i, from := range bounds {
		to := time.Now().Add(time.Hour)
		if i+1 < len(bounds) {
			to = bounds[i+1]
		}
		churn := 0
		if i > 0 {
			churn = ticks[i-1].stopped
			require.LessOrEqual(t, churn, maxChurn, "stops at one tick")
		}
		for _, s := range starts {
			if !s.Before(from) && s.Before(to) {
				churn++
			}
		}
		total += churn
		if i+1 < len(bounds) {
			intervals := max(1, int((to.Sub(from)+50*time.Millisecond)/interval))
			require.LessOrEqual(t, churn, 2*maxChurn*intervals, "churn between ticks %d and %d (%s apart)", i, i+1, to.Sub(from).Round(time.Millisecond))
		}
	}
	t.Logf("%d replications, %d runs (%d starts+stops) in %s over %d logged rotation ticks; %d at most at once",
		jobs, len(starts), total, took.Round(time.Millisecond), len(ticks), most)
	for _, id := range ids {
		t.Logf("%s resumed from %v", id, resumed[id])
	}
}
