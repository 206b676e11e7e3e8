package postgres

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
)

// measureStore returns a store on a fresh database for a test that prints
// a measurement, skipping it unless the environment variable env is set.
func measureStore(t *testing.T, env string) (context.Context, *Store) {
	t.Helper()
	if os.Getenv(env) == "" {
		t.Skip("set " + env + "=1")
	}
	ctx := context.Background()
	st, err := Open(ctx, pgtest.New(t))
	if err != nil {
		t.Fatal(err)
	}
	return ctx, st
}

func TestExplainHotPath(t *testing.T) {
	ctx, st := measureStore(t, "STINT_EXPLAIN")
	submitNoop(t, ctx, st, 100000)
	st.pool.Exec(ctx, "ANALYZE")
	explain := func(q string, args ...any) { printPlan(t, ctx, st, "ANALYZE, BUFFERS", q, args...) }
	explain(claimSQL, "n", []string{"bench.noop"}, []int64{30e6}, 1000, int64(0), uuidArray(nil))
	var cols submitColumns
	for j := range 1000 {
		cols.add(store.NewTask{ID: api.TaskID(fmt.Sprintf("new-%09d", j)), Behavior: "bench.noop", Params: []byte(`{}`), Priority: 5}, false)
	}
	explain(submitSQL, append(cols.args(), false, false, cols.rateUses, cols.versions)...)
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
	// A takeover that finds nothing expired, with a claim's tasks running.
	if _, err := st.Claim(ctx, store.ClaimRequest{Node: "n", Behaviors: []store.BehaviorLease{{Behavior: "bench.noop", Lease: time.Minute}}, Limit: 1000}); err != nil {
		t.Fatal(err)
	}
	explain(takeoverSQL, 100)
}

// TestExplainCleanup prints the plans of the cleanup's deletes on a table
// in the steady state of a queue under cleanup: 200,000 tasks created over
// the last seven days and two hours, so that the oldest 1% are past the
// default retention of a success, most of them finished for good, a tenth
// with a retention of their own of six days. It prints them first with the
// indexes that serve them, then without (the plans before those indexes).
func TestExplainCleanup(t *testing.T) {
	ctx, st := measureStore(t, "STINT_EXPLAIN")
	// Tasks created every 3.06 seconds, finished a minute after; every
	// tenth with a retention of six days; every fiftieth still scheduled.
	if _, err := st.pool.Exec(ctx, `
		INSERT INTO stint_task (id, behavior, status, params, result, created_at, finished_at, executed_at,
		    schedule_not_before, retention_us)
		SELECT 'task-' || i, 'bench.noop', CASE WHEN i % 50 = 0 THEN 'scheduled' ELSE 'success' END, '{}',
		    CASE WHEN i % 50 = 0 THEN NULL ELSE '{}'::jsonb END,
		    now() - (i * interval '3.06 seconds'),
		    CASE WHEN i % 50 = 0 THEN NULL ELSE now() - (i * interval '3.06 seconds') + interval '1 minute' END,
		    CASE WHEN i % 50 = 0 THEN NULL ELSE now() - (i * interval '3.06 seconds') END,
		    CASE WHEN i % 50 = 0 THEN now() ELSE NULL END,
		    CASE WHEN i % 10 = 1 THEN 518400000000 ELSE NULL END
		FROM generate_series(1, 200000) i`); err != nil {
		t.Fatal(err)
	}
	explain := func(q string, args ...any) { printPlan(t, ctx, st, "ANALYZE, BUFFERS, COSTS OFF", q, args...) }
	week := (7 * 24 * time.Hour).Microseconds()
	for _, indexed := range []bool{true, false} {
		if !indexed {
			st.pool.Exec(ctx, `DROP INDEX stint_task_created; DROP INDEX stint_task_expiry`)
		}
		st.pool.Exec(ctx, "ANALYZE stint_task")
		fmt.Printf("==== indexes: %v\n", indexed)
		explain(deleteFinishedSQL, "bench.noop", "success", week, 1000)
		explain(deleteFinishedSQL, "bench.noop", "failure", week, 1000) // nothing to delete
		explain(deleteExpiredSQL, 1000)
	}
}

// submitNoop submits n due bench.noop tasks, task-000000000 on, in
// statements of 5,000.
func submitNoop(t *testing.T, ctx context.Context, st *Store, n int) {
	t.Helper()
	for i := 0; i < n; i += 5000 {
		tasks := make([]store.NewTask, min(5000, n-i))
		for j := range tasks {
			tasks[j] = store.NewTask{ID: api.TaskID(fmt.Sprintf("task-%09d", i+j)), Behavior: "bench.noop", Params: []byte(`{}`), Priority: 5}
		}
		if _, err := st.Submit(ctx, tasks); err != nil {
			t.Fatal(err)
		}
	}
}

// printPlan prints the plan of q, explained with options in a transaction
// that is rolled back, so that what ANALYZE runs is not kept; with
// STINT_EXPLAIN=generic, as a generic plan.
func printPlan(t *testing.T, ctx context.Context, st *Store, options, q string, args ...any) {
	t.Helper()
	tx, err := st.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the statement is explained, not kept
	if os.Getenv("STINT_EXPLAIN") == "generic" {
		if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Println(plan(t, ctx, tx, options, q, args...))
	fmt.Println("----")
}

// plan returns the plan of q, explained with options in tx.
func plan(t *testing.T, ctx context.Context, tx pgx.Tx, options, q string, args ...any) string {
	t.Helper()
	rows, err := tx.Query(ctx, "EXPLAIN ("+options+") "+q, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// TestExplainWake prints the plan of the finish of a fan-out's root, which
// wakes its 10,000 dependents (depsEndedSQL), offered a local start of
// 500, which a fan-out that wide leaves to the claimers.
func TestExplainWake(t *testing.T) {
	ctx, st := measureStore(t, "STINT_EXPLAIN")
	wf := api.TaskID("01a221e3-0d1c-7d74-8f3a-6735b9f40000")
	w := FanOutWorkflow(wf, 10_000)
	if _, err := st.SubmitWorkflow(ctx, nil, w); err != nil {
		t.Fatal(err)
	}
	root := string(wf) + "/n0"
	if _, err := st.pool.Exec(ctx, `UPDATE stint_task SET status = 'success', schedule_not_before = NULL, result = '{}',
		finished_at = now() WHERE id = $1`, root); err != nil {
		t.Fatal(err)
	}
	printPlan(t, ctx, st, "ANALYZE, BUFFERS, WAL", depsEndedSQL, textArray{root}, "n", []string{"bench.noop"}, []int64{60e6}, 500, textArray{})
}

// TestExplainWorkflowSubmit prints the plan of the submit of a fan-out of
// 10,001 nodes.
func TestExplainWorkflowSubmit(t *testing.T) {
	ctx, st := measureStore(t, "STINT_EXPLAIN")
	w := FanOutWorkflow("01a221e3-0d1c-7d74-8f3a-6735b9f40000", 10_000)
	printPlan(t, ctx, st, "ANALYZE, BUFFERS, WAL", workflowSubmitSQL, workflowSubmitArgs([]store.NewWorkflow{w}, true)...)
}

// FanOutWorkflow returns the workflow wf of bench.noop nodes n0 to n<width>,
// each of n1 on depending on n0, with ids as long as generated ones.
func FanOutWorkflow(wf api.TaskID, width int) store.NewWorkflow {
	w := store.NewWorkflow{Task: store.NewTask{ID: wf, Behavior: api.WorkflowBehavior, Params: []byte(`{}`), Priority: 5}}
	for j := range width + 1 {
		w.Nodes = append(w.Nodes, store.NewTask{ID: wf + api.TaskID(fmt.Sprintf("/n%d", j)), Behavior: "bench.noop",
			Params: []byte(`{}`), Priority: 5, ParentID: wf})
		w.Names, w.Rules = append(w.Names, fmt.Sprintf("n%d", j)), append(w.Rules, api.RuleAllSucceeded)
		w.DependsOn = append(w.DependsOn, nil)
		if j > 0 {
			w.DependsOn[j] = []int{0}
		}
	}
	return w
}

// TestExplainGroupClaim prints the plans of a claim's reads under caps
// per group key (16 keys of 800 tasks, each key capped at 4), after 50
// claims and finishes of 64 tasks have left the entries of their hints in
// the index of keys, as a node working them does between two vacuums.
func TestExplainGroupClaim(t *testing.T) {
	ctx, st := measureStore(t, "STINT_EXPLAIN")
	var tasks []store.NewTask
	for i := range 16 * 800 {
		tasks = append(tasks, store.NewTask{ID: api.TaskID(fmt.Sprintf("task-%09d", i)), Behavior: "bench.noop", Params: []byte(`{}`),
			Priority: 5, GroupKey: fmt.Sprintf("key-%02d", i%16)})
	}
	if _, err := st.Submit(ctx, tasks); err != nil {
		t.Fatal(err)
	}
	req := store.ClaimRequest{Node: "n", Behaviors: []store.BehaviorLease{{Behavior: "bench.noop", Lease: time.Minute}},
		Limit: 1000, PerGroup: 4, Flow: true}
	for range 50 {
		claimed, _, err := st.ClaimFlow(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		var cs []store.Completion
		for _, c := range claimed {
			cs = append(cs, store.Completion{LeaseRef: c.LeaseRef, Status: api.StatusSuccess, Result: []byte(`{}`)})
		}
		if _, err := st.Finish(ctx, cs); err != nil {
			t.Fatal(err)
		}
	}
	explain := func(q string, args ...any) {
		tx, err := st.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // the statement is explained, not kept
		if _, err := tx.Exec(ctx, flowSettingsSQL); err != nil {
			t.Fatal(err)
		}
		fmt.Println(plan(t, ctx, tx, "ANALYZE, BUFFERS", q, args...))
		fmt.Println("----")
	}
	explain(runningSQL, "bench.noop", []string{}, []pgtype.UUID{})
	explain(flowRoomSQL, "bench.noop", int64(0), 4, []string{}, []pgtype.TID{}, "", 1000, "{}", noKeyWindow)
}
