package impl_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// callerTx is a transaction of the caller's, of pgx or of database/sql,
// as a workflow submit in it sees it.
type callerTx struct {
	submit   func(api.WorkflowRequest) (api.WorkflowSubmission, error)
	exec     func(sql string) error
	commit   func() error
	rollback func() error
}

// TestSubmitWorkflowInACallersTransaction submits a workflow in a pgx
// transaction and in a database/sql one, each also writing a row of the
// caller's. Nothing of the workflow is seen before the commit, a rollback
// leaves nothing, a bad graph is refused and leaves the transaction
// usable, a second submit of the id in it stores nothing, and the
// commit's notification starts the workflow on a node whose polls are too
// slow to find it.
func TestSubmitWorkflowInACallersTransaction(t *testing.T) {
	t.Parallel()
	e := setup(t)
	db := e.sqlDB()
	srv := e.server("node", 5*time.Second, slowPolls)
	kinds := []struct {
		name  string
		begin func(t *testing.T) callerTx
	}{
		{"pgx", func(t *testing.T) callerTx {
			tx, err := e.pool.Begin(e.ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return callerTx{
				submit: func(r api.WorkflowRequest) (api.WorkflowSubmission, error) {
					return srv.SubmitWorkflowTx(e.ctx, tx, r)
				},
				exec:     func(sql string) error { _, err := tx.Exec(e.ctx, sql); return err },
				commit:   func() error { return tx.Commit(e.ctx) },
				rollback: func() error { return tx.Rollback(e.ctx) },
			}
		}},
		{"sql", func(t *testing.T) callerTx {
			tx, err := db.BeginTx(e.ctx, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			return callerTx{
				submit: func(r api.WorkflowRequest) (api.WorkflowSubmission, error) {
					return srv.SubmitWorkflowSQLTx(e.ctx, tx, r)
				},
				exec:     func(sql string) error { _, err := tx.ExecContext(e.ctx, sql); return err },
				commit:   tx.Commit,
				rollback: tx.Rollback,
			}
		}},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			id := api.TaskID("wf-tx-" + k.name)
			graph := api.WorkflowRequest{ID: id, Nodes: []api.WorkflowNode{spanNode("a", 0), spanNode("b", 0, "a")}}
			stored := func() int {
				return e.count(`SELECT count(*) FROM stint_task WHERE id = $1 OR parent_id = $1`, string(id))
			}

			tx := k.begin(t)
			sub, err := tx.submit(graph)
			require.NoError(t, err)
			require.True(t, sub.Created)
			_, err = srv.GetWorkflow(e.ctx, id)
			require.ErrorIs(t, err, api.ErrNotFound, "the workflow is invisible before the commit")
			require.NoError(t, tx.rollback())
			require.Zero(t, stored(), "a rollback leaves nothing")

			tx = k.begin(t)
			_, err = tx.submit(api.WorkflowRequest{ID: id, Nodes: []api.WorkflowNode{spanNode("a", 0, "a")}})
			require.ErrorIs(t, err, api.ErrInvalid)
			require.NoError(t, tx.exec(`INSERT INTO test_effect (task_id, step) VALUES ('`+string(id)+`', 1)`),
				"a refused graph leaves the transaction usable")
			sub, err = tx.submit(graph)
			require.NoError(t, err)
			require.True(t, sub.Created)
			again, err := tx.submit(graph)
			require.NoError(t, err)
			require.False(t, again.Created, "a second submit of the id in the transaction shares the first")
			require.NoError(t, tx.commit())

			ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
			defer cancel()
			w, err := srv.AwaitWorkflow(ctx, id)
			require.NoError(t, err, "the commit's notification started the workflow")
			require.Equal(t, api.WorkflowSucceeded, w.State)
			require.Equal(t, map[api.Status]int{api.StatusSuccess: 2}, w.Counts)
			require.Equal(t, 1, e.count(`SELECT count(*) FROM test_effect WHERE task_id = $1`, string(id)))
		})
	}

	_, err := srv.SubmitWorkflowTx(e.ctx, nil, api.WorkflowRequest{Nodes: []api.WorkflowNode{spanNode("a", 0)}})
	require.ErrorIs(t, err, api.ErrInvalid)
	_, err = srv.SubmitWorkflowSQLTx(e.ctx, nil, api.WorkflowRequest{Nodes: []api.WorkflowNode{spanNode("a", 0)}})
	require.ErrorIs(t, err, api.ErrInvalid)
}
