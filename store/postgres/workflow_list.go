package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// listWorkflowsSQL reads a page of the workflows' own tasks after the id
// $1, in the state $2 (any state when empty), at most $3 rows, without their params,
// result and progress (briefColumns: a list shows none). A workflow is
// running while its task has not finished and some node has not ended
// (children_pending); once its task finished, the task's status and error
// code say its state. A workflow whose nodes all ended but whose task has
// not yet recorded the outcome matches each final state: its nodes decide
// (see store.Workflows.ListWorkflows).
//
// It walks the partial index stint_task_workflow in id order, which holds
// the workflows alone: however many tasks there are, it reads the
// workflows it skips and returns, never the other tasks. The behavior is
// written here rather than passed, so that every plan, the generic one
// too, can use the index.
var listWorkflowsSQL = `SELECT ` + briefColumns + ` FROM stint_task
	WHERE behavior = '` + string(api.WorkflowBehavior) + `' AND id > $1
	  AND CASE WHEN $2 = '' THEN true
	      WHEN status NOT IN ('success', 'failure') OR schedule_not_before IS NOT NULL
	          THEN (coalesce(children_pending, 0) > 0) = ($2 = '` + string(api.WorkflowRunning) + `')
	      WHEN status = 'success' THEN $2 = '` + string(api.WorkflowSucceeded) + `'
	      WHEN error->>'code' = '` + store.WorkflowCancelledCode + `' THEN $2 = '` + string(api.WorkflowCancelled) + `'
	      ELSE $2 = '` + string(api.WorkflowFailed) + `' END
	ORDER BY id LIMIT $3`

// ListWorkflows returns a page of the workflows' own tasks; see
// store.Workflows.
func (s *Store) ListWorkflows(ctx context.Context, f api.WorkflowFilter) (api.Page, error) {
	limit := pageLimit(f.Limit)
	var page api.Page
	err := s.reading(ctx, func(db *pgxpool.Pool, _ bool) error {
		var err error
		page, err = readPage(ctx, db, limit, listWorkflowsSQL, string(f.After), string(f.State), limit+1)
		return err
	})
	if err != nil {
		return page, fmt.Errorf("list workflows: %w", err)
	}
	return page, nil
}
