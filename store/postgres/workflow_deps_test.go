package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// A workflow node of one dependency keeps it in its task's column, with
// no edge row, once every registered node reads that column; while a node
// of an earlier release (which reads edge rows alone) is registered, it
// gets an edge row as before. Either way the dependency's finish wakes it,
// and the workflow's graph and the node's wait name its dependency.
func TestASingleDependencyIsStoredWhereEveryNodeReadsIt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	dsn := pgtest.New(t)
	open := func() *postgres.Store {
		st, err := postgres.Open(ctx, dsn)
		require.NoError(t, err)
		t.Cleanup(st.Close)
		return st
	}
	count := func(st *postgres.Store, sql string, args ...any) int {
		var n int
		require.NoError(t, st.Pool().QueryRow(ctx, sql, args...).Scan(&n))
		return n
	}
	check := func(st *postgres.Store, wf api.TaskID, rows, columns int) {
		t.Helper()
		root := fanOutT(t, ctx, st, wf, "", "b", "c")
		require.Equal(t, rows, count(st, `SELECT count(*) FROM stint_dependency WHERE task_id LIKE $1 || '/%'`, string(wf)))
		require.Equal(t, columns, count(st, `SELECT count(*) FROM stint_task WHERE parent_id = $1 AND depends_on IS NOT NULL`, string(wf)))

		nodes, err := st.WorkflowNodes(ctx, wf)
		require.NoError(t, err)
		deps := map[string][]string{}
		for _, n := range nodes {
			deps[n.Name] = n.DependsOn
		}
		require.Equal(t, map[string][]string{"root": nil, "b": {"root"}, "c": {"root"}}, deps)
		b, err := st.Get(ctx, wf+"/b")
		require.NoError(t, err)
		require.Equal(t, api.StatusWaiting, b.Status)
		require.NotNil(t, b.Waiting)
		require.Equal(t, []string{"root"}, b.Waiting.Dependencies)

		finishT(t, ctx, st, success(root))
		require.Equal(t, api.StatusScheduled, statusT(t, ctx, st, wf+"/b"), "the root's finish wakes its dependents")
		require.Equal(t, api.StatusScheduled, statusT(t, ctx, st, wf+"/c"))
		for _, c := range claimT(t, ctx, st, 2, 0) {
			finishT(t, ctx, st, success(c))
		}
		require.Equal(t, api.StatusScheduled, statusT(t, ctx, st, wf), "its nodes ended: the workflow is due")
	}

	old := open()
	require.NoError(t, old.RegisterNode(ctx, store.Node{ID: "old", Host: "h", PID: 1}))
	_, err := old.Pool().Exec(ctx, `UPDATE stint_node SET reads_depends_on = false WHERE id = 'old'`)
	require.NoError(t, err)
	check(old, "wf-old", 2, 0)

	require.NoError(t, old.DeregisterNode(ctx, "old"))
	require.NoError(t, old.RegisterNode(ctx, store.Node{ID: "new", Host: "h", PID: 2}))
	check(open(), "wf-new", 0, 2)
}

// Each optional column of a workflow's nodes is stored as submitted,
// whether a batch's nodes all leave it at its default (the column is then
// sent empty) or some set it, and a node left at the default in a batch
// that sets it for another node keeps its default.
func TestWorkflowNodeColumnsAreStoredAsSubmitted(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	set := store.NewTask{Behavior: semBehavior, Params: []byte(`{"a":1}`), Priority: 3, Delay: time.Hour, GroupKey: "g",
		Trace: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Notify: true, Retention: 2 * time.Hour,
		RateUses: []store.RateUse{{Limit: "api", Units: 2}}, Version: 4}
	workflow := func(id api.TaskID, nodes ...store.NewTask) store.NewWorkflow {
		w := store.NewWorkflow{Task: store.NewTask{ID: id, Behavior: api.WorkflowBehavior, Params: []byte(`{}`), Priority: 5}}
		for i, n := range nodes {
			name := string(rune('a' + i))
			n.ID, n.ParentID = id+"/"+api.TaskID(name), id
			w.Nodes, w.Names, w.Rules = append(w.Nodes, n), append(w.Names, name), append(w.Rules, api.RuleAllSucceeded)
			w.DependsOn = append(w.DependsOn, nil)
		}
		return w
	}
	plain := store.NewTask{Behavior: semBehavior, Params: []byte(`{}`), Priority: 5}
	mixed := workflow("wf-mixed", set, plain)
	mixed.DependsOn[1] = []int{0}
	for _, batch := range [][]store.NewWorkflow{{mixed, workflow("wf-beside", plain, plain)}, {workflow("wf-plain", plain, plain)}} {
		out, err := st.SubmitWorkflows(ctx, nil, batch)
		require.NoError(t, err)
		for _, o := range out {
			require.NoError(t, o.Err)
			require.True(t, o.Created)
		}
	}

	type row struct {
		Priority                  int
		Due                       bool
		DelayS                    float64
		Group, Trace, Uses, DepOn string
		Awaited                   bool
		RetentionUS               int64
		Version                   int
	}
	read := func(id api.TaskID) row {
		var r row
		require.NoError(t, st.Pool().QueryRow(ctx, `SELECT priority, schedule_not_before IS NOT NULL,
			coalesce(extract(epoch FROM schedule_not_before - created_at), 0)::float8, coalesce(group_key, ''), coalesce(trace, ''),
			coalesce(rate_uses::text, ''), coalesce(depends_on, ''), awaited, coalesce(retention_us, 0), coalesce(version, 0)
			FROM stint_task WHERE id = $1`, string(id)).Scan(&r.Priority, &r.Due, &r.DelayS, &r.Group, &r.Trace, &r.Uses, &r.DepOn,
			&r.Awaited, &r.RetentionUS, &r.Version))
		r.DelayS = float64(int(r.DelayS + 0.5))
		return r
	}
	require.Equal(t, row{Priority: 3, Due: true, DelayS: 3600, Group: "g", Trace: set.Trace, Uses: `[{"l": "api", "u": 2}]`,
		Awaited: true, RetentionUS: (2 * time.Hour).Microseconds(), Version: 4}, read("wf-mixed/a"))
	require.Equal(t, row{Priority: 5, DepOn: "wf-mixed/a"}, read("wf-mixed/b"))
	for _, id := range []api.TaskID{"wf-beside/a", "wf-beside/b", "wf-plain/a", "wf-plain/b"} {
		require.Equal(t, row{Priority: 5, Due: true}, read(id), id)
	}
}
