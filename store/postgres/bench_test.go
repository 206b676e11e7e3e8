package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(b *testing.B) *postgres.Store {
	b.Helper()
	st, err := postgres.Open(context.Background(), pgtest.New(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	return st
}

func newTasks(n, offset int) []store.NewTask {
	tasks := make([]store.NewTask, n)
	for i := range tasks {
		tasks[i] = store.NewTask{ID: api.TaskID(fmt.Sprintf("task-%09d", offset+i)), Behavior: "bench.noop", Params: []byte(`{}`), Priority: 5}
	}
	return tasks
}

var noop = []store.BehaviorLease{{Behavior: "bench.noop", Lease: 30 * time.Second}}

// submitDue submits n due bench.noop tasks in statements of 5,000.
func submitDue(b *testing.B, st *postgres.Store, n int) {
	b.Helper()
	for i := 0; i < n; i += 5000 {
		if _, err := st.Submit(context.Background(), newTasks(min(5000, n-i), i)); err != nil {
			b.Fatal(err)
		}
	}
}

// claimAll claims the b.N due bench.noop tasks in claims of 1,000 for
// behaviors and finishes them, and reports tasks/s and the mean time of a
// claim. A claim that finds nothing, or a task of another behavior, fails
// the benchmark.
func claimAll(b *testing.B, st *postgres.Store, behaviors []store.BehaviorLease) {
	b.Helper()
	ctx := context.Background()
	var claimTime time.Duration
	start := time.Now()
	for done := 0; done < b.N; {
		t0 := time.Now()
		claimed, err := st.Claim(ctx, store.ClaimRequest{Node: "bench", Behaviors: behaviors, Limit: 1000})
		if err != nil {
			b.Fatal(err)
		}
		claimTime += time.Since(t0)
		if len(claimed) == 0 {
			b.Fatalf("claimed nothing after %d of %d tasks", done, b.N)
		}
		cs := make([]store.Completion, len(claimed))
		for i, c := range claimed {
			if c.Behavior != "bench.noop" {
				b.Fatalf("claimed a task of %s", c.Behavior)
			}
			cs[i] = store.Completion{LeaseRef: c.LeaseRef, Status: api.StatusSuccess, Result: []byte(`{}`)}
		}
		if _, err := st.Finish(ctx, cs); err != nil {
			b.Fatal(err)
		}
		done += len(claimed)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
	b.ReportMetric(float64(claimTime.Microseconds())/float64((b.N+999)/1000), "µs/claim-of-1000")
}

// BenchmarkSubmit measures one-task submits.
func BenchmarkSubmit(b *testing.B) {
	st := open(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		if _, err := st.Submit(ctx, newTasks(1, i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSubmitMany measures submits of 1,000 tasks in one statement;
// one op is one task.
func BenchmarkSubmitMany(b *testing.B) {
	st := open(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i += 1000 {
		if _, err := st.Submit(ctx, newTasks(min(1000, b.N-i), i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimAndFinish measures claims and completions in batches of
// 1,000 from a table of due tasks; one op is one task claimed and finished.
func BenchmarkClaimAndFinish(b *testing.B) {
	st := open(b)
	ctx := context.Background()
	submitDue(b, st, b.N)
	var claimTime, finishTime time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; {
		t0 := time.Now()
		claimed, err := st.Claim(ctx, store.ClaimRequest{Node: "bench", Behaviors: noop, Limit: 1000})
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		cs := make([]store.Completion, len(claimed))
		for i, c := range claimed {
			cs[i] = store.Completion{LeaseRef: c.LeaseRef, Status: api.StatusSuccess, Result: []byte(`{}`)}
		}
		if _, err := st.Finish(ctx, cs); err != nil {
			b.Fatal(err)
		}
		claimTime += t1.Sub(t0)
		finishTime += time.Since(t1)
		done += len(claimed)
	}
	b.ReportMetric(float64(claimTime.Nanoseconds())/float64(b.N), "claim-ns/task")
	b.ReportMetric(float64(finishTime.Nanoseconds())/float64(b.N), "finish-ns/task")
}

// BenchmarkClaimWithHistory measures claims and completions with 0, 1M, 5M
// and 10M finished tasks in the table (cleanup off): claims read only the
// claim hints and finished tasks have none, so the cost should not grow
// with them. The 5M and 10M cases take minutes to set up (10M: about 6 GB
// of table); -short skips them.
func BenchmarkClaimWithHistory(b *testing.B) {
	for _, history := range []int{0, 1_000_000, 5_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("finished=%d", history), func(b *testing.B) {
			if testing.Short() && history > 1_000_000 {
				b.Skip("-short")
			}
			st := open(b)
			ctx := context.Background()
			if _, err := st.Pool().Exec(ctx, `
				INSERT INTO stint_task (id, behavior, status, params, result, attempt, executed_at, finished_at)
				SELECT 'old-' || g, 'bench.noop', 'success', '{}', '{}', 1, now(), now() FROM generate_series(1, $1) g`, history); err != nil {
				b.Fatal(err)
			}
			if _, err := st.Pool().Exec(ctx, `VACUUM ANALYZE stint_task`); err != nil {
				b.Fatal(err)
			}
			submitDue(b, st, b.N)
			b.ResetTimer()
			claimAll(b, st, noop)
		})
	}
}

// BenchmarkClaimPastParked measures claims and completions of one behavior
// while 0 or 1M due tasks of a paused behavior, or of a held group, wait at
// a higher priority: a claim must not walk past them, so the cost should
// not grow with them.
func BenchmarkClaimPastParked(b *testing.B) {
	for _, c := range []struct {
		name    string
		parked  int
		paused  bool
		grouped bool
		other   bool // bench.other is not paused, only not run by this claimer
	}{{"empty", 0, false, false, false}, {"paused=1M", 1_000_000, true, false, false}, {"held=1M", 1_000_000, false, true, false},
		{"unclaimed=1M", 1_000_000, false, false, true}} {
		b.Run(c.name, func(b *testing.B) {
			st := open(b)
			ctx := context.Background()
			// Only the hints: the claim leaves out paused behaviors and
			// held keys before it reads a task, and the cost of a large
			// task table is BenchmarkClaimWithHistory's.
			if _, err := st.Pool().Exec(ctx, `
				INSERT INTO stint_due (id, behavior, priority, due, group_key)
				SELECT 'parked-' || g, 'bench.other', 0, now() - interval '1 hour', CASE WHEN $2 THEN 'held' END
				FROM generate_series(1, $1) g`, c.parked, c.grouped); err != nil {
				b.Fatal(err)
			}
			if c.paused {
				if err := st.SetBehavior(ctx, store.BehaviorSettings{Behavior: "bench.other", Paused: true}); err != nil {
					b.Fatal(err)
				}
			}
			if c.grouped {
				if err := st.HoldGroup(ctx, "held"); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := st.Pool().Exec(ctx, `VACUUM ANALYZE stint_task, stint_due`); err != nil {
				b.Fatal(err)
			}
			submitDue(b, st, b.N)
			behaviors := []store.BehaviorLease{noop[0], {Behavior: "bench.other", Lease: 30 * time.Second}}
			if c.other {
				behaviors = noop
			}
			b.ResetTimer()
			claimAll(b, st, behaviors)
		})
	}
}

// BenchmarkClaimConcurrent measures claims and completions of batches of
// 250 by 1 and 4 claimers side by side, as node processes claim: where the
// claimers meet at the head of the claim index, 4 claim less than 1.
func BenchmarkClaimConcurrent(b *testing.B) {
	for _, claimers := range []int{1, 4} {
		b.Run(fmt.Sprintf("claimers=%d", claimers), func(b *testing.B) {
			st := open(b)
			ctx := context.Background()
			submitDue(b, st, b.N)
			var done atomic.Int64
			errs := make(chan error, claimers)
			b.ResetTimer()
			start := time.Now()
			for c := range claimers {
				go func() {
					for done.Load() < int64(b.N) {
						claimed, err := st.Claim(ctx, store.ClaimRequest{Node: fmt.Sprintf("bench-%d", c), Behaviors: noop, Limit: 250})
						if err != nil {
							errs <- err
							return
						}
						cs := make([]store.Completion, len(claimed))
						for i, c := range claimed {
							cs[i] = store.Completion{LeaseRef: c.LeaseRef, Status: api.StatusSuccess, Result: []byte(`{}`)}
						}
						if _, err := st.Finish(ctx, cs); err != nil {
							errs <- err
							return
						}
						done.Add(int64(len(claimed)))
					}
					errs <- nil
				}()
			}
			for range claimers {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
		})
	}
}

// BenchmarkWorkflowFanOut stores workflows of a root and 10,000
// dependents of it, and finishes each root (on a node offered 500 slots):
// it reports the submit's and the finish's time, the finish being the
// wake of all 10,000 nodes in one transaction. One op is one workflow.
// Workflow ids are as long as generated ones (a UUID): ids of 4 bytes
// made both a third quicker.
func BenchmarkWorkflowFanOut(b *testing.B) {
	const width = 10_000
	st := open(b)
	ctx := context.Background()
	leases := []store.BehaviorLease{{Behavior: "bench.noop", Lease: time.Minute}}
	var submit, finish time.Duration
	for i := range b.N {
		w := postgres.FanOutWorkflow(api.TaskID(fmt.Sprintf("01a221e3-0d1c-7d74-8f3a-6735b9f4%04d", i)), width)
		t0 := time.Now()
		if _, err := st.SubmitWorkflow(ctx, nil, w); err != nil {
			b.Fatal(err)
		}
		submit += time.Since(t0)
		claimed, err := st.Claim(ctx, store.ClaimRequest{Node: "bench", Behaviors: leases, Limit: 1})
		if err != nil || len(claimed) != 1 {
			b.Fatalf("claim the root: %v, %d claimed", err, len(claimed))
		}
		t0 = time.Now()
		_, started, err := st.FinishStart(ctx, []store.Completion{{LeaseRef: claimed[0].LeaseRef, Status: api.StatusSuccess, Result: []byte(`{}`), HasParent: true}},
			store.LocalStart{Node: "bench", Behaviors: leases, Reserve: func() int { return 500 }})
		// A fan-out wider than the room offered starts none here.
		if err != nil || len(started) != 0 {
			b.Fatalf("finish the root: %v, %d started", err, len(started))
		}
		finish += time.Since(t0)
		// The nodes are claimed and finished by no one: the
		// next workflow's root is found past their hints by priority.
		if _, err := st.Pool().Exec(ctx, `DELETE FROM stint_due`); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(submit.Milliseconds())/float64(b.N), "submit-ms")
	b.ReportMetric(float64(finish.Milliseconds())/float64(b.N), "wake-ms")
}

// BenchmarkSpawn spawns one child at a time of a running parent, each
// with a new id: a spawn's transaction, its locks and round trips.
func BenchmarkSpawn(b *testing.B) {
	st := open(b)
	ctx := context.Background()
	submitDue(b, st, 1)
	claimed, err := st.Claim(ctx, store.ClaimRequest{Node: "bench", Behaviors: noop, Limit: 1})
	if err != nil || len(claimed) != 1 {
		b.Fatalf("claim the parent: %v, %d claimed", err, len(claimed))
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := st.Spawn(ctx, claimed[0].LeaseRef, newTasks(1, 1+i)); err != nil {
			b.Fatal(err)
		}
	}
}
