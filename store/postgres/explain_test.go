package postgres

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

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
	for i := 0; i < 100000; i += 5000 {
		tasks := make([]store.NewTask, 5000)
		for j := range tasks {
			tasks[j] = store.NewTask{ID: api.TaskID(fmt.Sprintf("task-%09d", i+j)), Behavior: "bench.noop", Params: []byte(`{}`), Priority: 5}
		}
		if _, err := st.Submit(ctx, tasks); err != nil {
			t.Fatal(err)
		}
	}
	st.pool.Exec(ctx, "ANALYZE")
	conn, err := st.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if os.Getenv("STINT_EXPLAIN") == "generic" {
		conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	}
	explain := func(q string, args ...any) {
		rows, err := conn.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+q, args...)
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
	claimed, err := st.Claim(ctx, store.ClaimRequest{Node: "n", Behaviors: []store.BehaviorLease{{Behavior: "bench.noop", Lease: time.Minute}}, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var ids, statuses, results []string
	var leases []pgtype.UUID
	var errs []*string
	var again []int64
	var waits []bool
	for _, c := range claimed {
		ids, leases, statuses, results = append(ids, string(c.ID)), append(leases, uuid(c.Lease)), append(statuses, "success"), append(results, "{}")
		errs, again, waits = append(errs, nil), append(again, -1), append(waits, false)
	}
	explain(finishSQL, ids, leases, statuses, results, errs, again, waits)
}
