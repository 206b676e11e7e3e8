package impl_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// capWatch counts the runs of a behavior inside it: those running at
// once, in all and by group key, the most of each seen, and the runs of
// each task.
type capWatch struct {
	running atomic.Int64
	most    atomic.Int64
	mu      sync.Mutex
	keys    map[string]int
	keyMost int
	runs    map[api.TaskID]int
	in      map[api.TaskID]string // the runs under way, by task, with their keys
	out     map[api.TaskID]bool   // the tasks whose run ended
}

func newCapWatch() *capWatch {
	return &capWatch{keys: map[string]int{}, runs: map[api.TaskID]int{}, in: map[api.TaskID]string{}, out: map[api.TaskID]bool{}}
}

// enter counts a run of task id, of group key, that begins.
func (w *capWatch) enter(id api.TaskID, key string) {
	n := w.running.Add(1)
	for m := w.most.Load(); n > m && !w.most.CompareAndSwap(m, n); m = w.most.Load() {
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.runs[id]++
	w.in[id] = key
	if key != "" {
		w.keys[key]++
		w.keyMost = max(w.keyMost, w.keys[key])
	}
}

// leave counts the end of a run of task id, of group key.
func (w *capWatch) leave(id api.TaskID, key string) {
	w.mu.Lock()
	delete(w.in, id)
	w.out[id] = true
	if key != "" {
		w.keys[key]--
	}
	w.mu.Unlock()
	w.running.Add(-1)
}

// holding returns how many slots, in all and of the fullest key, hold at
// once the tasks of running (task ids with their group keys, as the
// database showed them) and the runs under way: a task shown running
// whose run has not ended (its run is under way, or about to begin)
// holds a slot now, as does every run under way. Runs that ended and
// whose ends are not recorded yet hold none.
func (w *capWatch) holding(running map[api.TaskID]string) (all, key int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	keys := map[string]int{}
	for id, k := range running {
		if _, in := w.in[id]; !in && !w.out[id] {
			all++
			keys[k]++
		}
	}
	for _, k := range w.in {
		all++
		keys[k]++
	}
	for k, n := range keys {
		if k != "" {
			key = max(key, n)
		}
	}
	return all, key
}

type capParams struct {
	Key string `json:"key,omitempty"`
	N   int    `json:"n"`
}

// capProbe is a behavior whose runs take 3 ms under its policy, counted
// by its watch.
type capProbe struct {
	id     api.BehaviorID
	policy spi.Policy
	w      *capWatch
}

func (p capProbe) Kind() api.Kind[capParams, struct{}] {
	return api.Kind[capParams, struct{}]{ID: p.id}
}
func (capProbe) TaskID(ids spi.IDs, p capParams) api.TaskID {
	return ids.Deterministic(fmt.Sprint(p.N))
}
func (capProbe) GroupKey(p capParams) string { return p.Key }
func (p capProbe) Policy() spi.Policy        { return p.policy }
func (p capProbe) Run(ctx context.Context, rc spi.RunContext, c capParams) (struct{}, error) {
	p.w.enter(rc.TaskID(), c.Key)
	defer p.w.leave(rc.TaskID(), c.Key)
	return struct{}{}, spi.Sleep(ctx, 3*time.Millisecond)
}

// TestHandOverKeepsCaps runs a backlog of short tasks under each kind of
// cap a finish hands slots over for, on two nodes: MaxConcurrency 2 (per
// node), GroupConcurrency 2 over three group keys and ClusterConcurrency 3.
// The runs inside the behavior never exceed the cap, each task runs once
// and succeeds, and the finishes handed slots over (tasks started without
// a claim; while none has, another backlog runs, up to 5). The database
// never shows more tasks running than the cap allows: every task it shows
// running either runs, is about to, or ran and returned, its end not
// recorded yet; those running or about to are within the cap.
func TestHandOverKeepsCaps(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		policy spi.Policy
		keys   int
		cap    int // the most runs at once across the two nodes
		keyCap int
	}{
		{name: "max concurrency", policy: spi.Policy{MaxConcurrency: 2}, cap: 4},
		{name: "group concurrency", policy: spi.Policy{GroupConcurrency: 2}, keys: 3, cap: 6, keyCap: 2},
		{name: "cluster concurrency", policy: spi.Policy{ClusterConcurrency: 3}, cap: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			w := newCapWatch()
			probe := capProbe{id: "test.handover", policy: tc.policy, w: w}
			const n = 300
			var servers []*impl.Server
			for i := range 2 {
				reg := spi.NewRegistry()
				spi.MustRegister[capParams, struct{}](reg, probe)
				srv, err := impl.NewServer(e.st, impl.ServerConfig{Node: fmt.Sprint("n", i), Registry: reg,
					PollInterval: 100 * time.Millisecond, HandOver: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				require.NoError(t, err)
				servers = append(servers, srv)
			}
			// submit adds a backlog of n tasks, numbered on from the last.
			submitted := 0
			submit := func() {
				reqs := make([]api.SubmitRequest, n)
				for i := range reqs {
					p := capParams{N: submitted + i}
					if tc.keys > 0 {
						p.Key = fmt.Sprint("k", i%tc.keys)
					}
					reqs[i] = api.SubmitRequest{Behavior: probe.id, Params: mustJSON(p)}
				}
				_, err := servers[0].SubmitMany(e.ctx, reqs)
				require.NoError(t, err)
				submitted += n
			}
			submit()

			// The database's view, sampled while the tasks run: the
			// slots its running tasks hold beside the runs under way.
			done := make(chan struct{})
			sampled := make(chan [2]int)
			go func() {
				var most [2]int
				for {
					select {
					case <-done:
						sampled <- most
						return
					default:
					}
					rows, err := e.pool.Query(e.ctx, `SELECT id, coalesce(group_key, '') FROM stint_task WHERE behavior = $1 AND status = 'running'`,
						string(probe.id))
					if err != nil {
						continue
					}
					running := map[api.TaskID]string{}
					var id, key string
					_, err = pgx.ForEachRow(rows, []any{&id, &key}, func() error {
						running[api.TaskID(id)] = key
						return nil
					})
					if err == nil {
						all, key := w.holding(running)
						most = [2]int{max(most[0], all), max(most[1], key)}
					}
				}
			}()
			for _, srv := range servers {
				require.NoError(t, srv.Start(e.ctx))
				t.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					_ = srv.Stop(ctx)
				})
			}
			// A finish hands over only when its node's completer is idle
			// and a cap binds, which a busy machine can make rare: while
			// none has, another backlog runs, up to 5 in all.
			handed := func() int64 { return impl.HandedOver(servers[0]) + impl.HandedOver(servers[1]) }
			for {
				waitFor(t, time.Minute, "every task to succeed", func() bool {
					return e.count(`SELECT count(*) FROM stint_task WHERE behavior = $1 AND status = 'success'`, string(probe.id)) == submitted
				})
				if handed() > 0 || submitted == 5*n {
					break
				}
				submit()
			}
			close(done)
			dbMost := <-sampled

			require.LessOrEqual(t, w.most.Load(), int64(tc.cap), "runs at once")
			if tc.keyCap > 0 {
				require.LessOrEqual(t, w.keyMost, tc.keyCap, "runs of a group key at once")
			}
			require.LessOrEqual(t, dbMost[0], tc.cap, "slots held by the tasks the database showed running and the runs")
			if tc.keyCap > 0 {
				require.LessOrEqual(t, dbMost[1], tc.keyCap, "slots of a group key held by the tasks the database showed running and the runs")
			}
			w.mu.Lock()
			require.Len(t, w.runs, submitted)
			for id, runs := range w.runs {
				require.Equal(t, 1, runs, "runs of task %s", id)
			}
			w.mu.Unlock()
			t.Logf("%d of %d tasks handed over; at most %d runs at once, %d slots held in the database's view (%d of a key)",
				handed(), submitted, w.most.Load(), dbMost[0], dbMost[1])
			require.Positive(t, handed(), "tasks the finishes handed over")
		})
	}
}
