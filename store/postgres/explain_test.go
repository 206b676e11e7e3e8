package postgres

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
)

func TestExplainHotPath(t *testing.T) {
	if os.Getenv("STINT_EXPLAIN") == "" {
		t.Skip("set STINT_EXPLAIN=1")
	}
	ctx := context.Background()
	st, err := Open(ctx, pgtest.New(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20000; i += 5000 {
		tasks := make([]store.NewTask, 5000)
		for j := range tasks {
			tasks[j] = store.NewTask{ID: api.TaskID(fmt.Sprintf("task-%09d", i+j)), Behavior: "bench.noop", Params: []byte(`{}`), Priority: 5}
		}
		if _, err := st.Submit(ctx, tasks); err != nil {
			t.Fatal(err)
		}
	}
	st.pool.Exec(ctx, "ANALYZE")
	explain := func(q string, args ...any) {
		rows, err := st.pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+q, args...)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			rows.Scan(&line)
			fmt.Println(line)
		}
		fmt.Println("----")
	}
	explain(claimSQL, "n", []string{"bench.noop"}, []int64{30e6}, 1000, int64(0))
	var cols submitColumns
	for j := range 1000 {
		cols.add(store.NewTask{ID: api.TaskID(fmt.Sprintf("new-%09d", j)), Behavior: "bench.noop", Params: []byte(`{}`), Priority: 5})
	}
	explain(submitSQL, append(cols.args(), false, false)...)
	_ = time.Second
}
