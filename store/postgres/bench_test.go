package postgres_test

import (
	"context"
	"fmt"
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
	for i := 0; i < b.N; i += 5000 {
		if _, err := st.Submit(ctx, newTasks(min(5000, b.N-i), i)); err != nil {
			b.Fatal(err)
		}
	}
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
