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
