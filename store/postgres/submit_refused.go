package postgres

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stinthq/stint/api"
)

// A submit never changes what a task of another behavior runs, nor a
// workflow's own task, nor (unless it shares the task) a workflow's node,
// whose runs its workflow decides, nor a child that ended for good, whose
// end its parent counted, unless it is the parent's run that spawns it
// again (a child submitted with a parent; Spawn counts it pending again):
// resubmitRefused and shareRefused are
// the conditions under which the existing task t refuses a resubmitting
// or a sharing submit, and refuseSubmit fails the statement, whole, with
// SQLSTATE SX409 (submitRefusedCode) and a message that names the stored
// task.
const (
	resubmitRefused = `(t.behavior <> excluded.behavior OR t.workflow_node IS NOT NULL OR t.behavior = '` + string(api.WorkflowBehavior) + `'
        OR (t.parent_id IS NOT NULL AND excluded.parent_id IS NULL AND ` + finishedForGood + `))`
	shareRefused = `(t.behavior <> excluded.behavior OR t.behavior = '` + string(api.WorkflowBehavior) + `')`
	refuseSubmit = `stint_submit_refused(t.id, t.behavior, excluded.behavior, t.workflow_node, t.parent_id)`
)

// submitRefusedCode is the SQLSTATE of stint_submit_refused.
const submitRefusedCode = "SX409"

// submitRefused returns err as an api.ErrConflict when it is a refusal of
// stint_submit_refused, and err otherwise.
func submitRefused(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == submitRefusedCode {
		return fmt.Errorf("%s: %w", pgErr.Message, api.ErrConflict)
	}
	return err
}
