package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// isWorkflow is the condition that a row of stint_task is workflow $1.
const isWorkflow = `id = $1 AND behavior = '` + string(api.WorkflowBehavior) + `'`

// holdWorkflowSQL holds workflow $1: its own task, so that the nodes its
// dependencies make ready later are stored held (see depsEndedSQL and
// growWorkflow), and its nodes that wait to run: scheduled, or waiting
// for a retry (as Hold holds a task). Running nodes run on.
var holdWorkflowSQL = `
WITH w AS (
    UPDATE stint_task SET status = 'held', updated_at = now()
    WHERE ` + isWorkflow + ` AND status = 'waiting'
    RETURNING id, behavior, parent_id
), u AS (
    UPDATE stint_task t SET status = 'held', held_due = t.schedule_not_before, schedule_not_before = NULL, executed_at = NULL,
        updated_at = now()
    FROM w WHERE t.parent_id = w.id AND t.workflow_node IS NOT NULL
      AND (t.status = 'scheduled' OR (t.status IN ('success', 'failure') AND t.schedule_not_before IS NOT NULL))
    RETURNING t.id, t.behavior, t.parent_id
), feed AS (` + feedInsert("(SELECT * FROM w UNION ALL SELECT * FROM u) x", "'held'::text", "false") + `)
SELECT count(*) FROM w`

// releaseWorkflowSQL releases workflow $1 and its held nodes: they are due
// at the time they were held with, or became ready at, or at once.
var releaseWorkflowSQL = `
WITH w AS (
    UPDATE stint_task SET
        status = CASE WHEN waiting_children THEN 'waiting' ELSE 'scheduled' END,
        schedule_not_before = CASE WHEN waiting_children THEN NULL ELSE coalesce(held_due, now()) END,
        held_due = NULL, updated_at = now()
    WHERE ` + isWorkflow + ` AND status = 'held'
    RETURNING id, behavior, parent_id, priority, schedule_not_before, group_key, status
), u AS (
    UPDATE stint_task t SET status = 'scheduled', schedule_not_before = coalesce(t.held_due, now()), held_due = NULL,
        updated_at = now()
    FROM w WHERE t.parent_id = w.id AND t.workflow_node IS NOT NULL AND t.status = 'held'
    RETURNING t.id, t.behavior, t.parent_id, t.priority, t.schedule_not_before, t.group_key, t.status
), due AS (` + dueInsert("(SELECT * FROM w UNION ALL SELECT * FROM u) x") + `
), feed AS (` + feedInsert("(SELECT * FROM w UNION ALL SELECT * FROM u) x", "status", "false") + `
), woke AS (
    SELECT count(pg_notify('` + store.ChannelDue + `', '')) AS n FROM (SELECT 1 FROM u LIMIT 1) d
)
SELECT count(*) FROM w, woke`

// removeWorkflowSQL deletes workflow $1 with its nodes and their edges.
// Running nodes halt at their next fenced write (they are told at once);
// awaiters learn the tasks are gone; the nodes' own children are orphans.
var removeWorkflowSQL = `
WITH w AS (
    DELETE FROM stint_task WHERE ` + isWorkflow + `
    RETURNING id, behavior, status, parent_id, awaited
), n AS (
    DELETE FROM stint_task t USING w WHERE t.parent_id = w.id AND t.workflow_node IS NOT NULL
    RETURNING t.id, t.behavior, t.status, t.parent_id, t.awaited
), edges AS (
    DELETE FROM stint_dependency d USING n WHERE d.task_id = n.id
), orphans AS (
    UPDATE stint_task c SET parent_id = NULL FROM n WHERE c.parent_id = n.id
), gone AS (
    SELECT * FROM w UNION ALL SELECT * FROM n
), attempts AS (
    DELETE FROM stint_attempt a WHERE a.task_id = ANY(ARRAY(SELECT id FROM gone))
), steps AS (` + stepsDelete("ARRAY(SELECT id FROM gone)") + `
), events AS (` + eventsDelete("ARRAY(SELECT id FROM gone)") + `
), ` + waitsEnded("SELECT id FROM gone") + `, waits_left AS (` + waitsLeft("SELECT id FROM gone") + `
), signals AS (` + signalsDelete("ARRAY(SELECT id FROM gone)") + `
), feed AS (` + feedInsert("gone", "'removed'::text", "true") + `
), told AS (
    SELECT count(pg_notify('` + store.ChannelFinished + `', id)) FILTER (WHERE awaited) +
        count(pg_notify('` + store.ChannelRemoved + `', id)) FILTER (WHERE status = 'running') AS n
    FROM gone
)
SELECT count(*) FROM w, told`

// HoldWorkflow holds a workflow; see store.Workflows.
func (s *Store) HoldWorkflow(ctx context.Context, id api.TaskID) error {
	return s.workflowOp(ctx, "hold", id, holdWorkflowSQL, api.StatusHeld)
}

// ReleaseWorkflow releases a held workflow; see store.Workflows.
func (s *Store) ReleaseWorkflow(ctx context.Context, id api.TaskID) error {
	return s.workflowOp(ctx, "release", id, releaseWorkflowSQL, "waiting")
}

// RemoveWorkflow deletes a workflow; see store.Workflows.
func (s *Store) RemoveWorkflow(ctx context.Context, id api.TaskID) error {
	return s.workflowOp(ctx, "remove", id, removeWorkflowSQL)
}

// workflowOp runs query, an operation on workflow id that reports the
// workflow rows it changed, in a transaction that first locks the
// workflow's row. A workflow it leaves alone is ErrNotFound when there is
// none, nothing when its state is one of done (the operation was done
// already), and ErrConflict otherwise.
func (s *Store) workflowOp(ctx context.Context, verb string, id api.TaskID, query string, done ...api.Status) error {
	err := retryDeadlock(ctx, s.pool, func(tx pgx.Tx) error {
		var status string
		err := tx.QueryRow(ctx, `SELECT status FROM stint_task WHERE `+isWorkflow+` FOR UPDATE`, string(id)).Scan(&status)
		if isNoRows(err) {
			return api.ErrNotFound
		}
		if err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, query, string(id)).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		for _, d := range done {
			if status == string(d) {
				return nil
			}
		}
		return fmt.Errorf("it has ended: %w", api.ErrConflict)
	})
	if err != nil {
		return fmt.Errorf("%s workflow %s: %w", verb, id, err)
	}
	return nil
}

// deadlockTries bounds the runs of a transaction that PostgreSQL ended to
// break a deadlock; see retryDeadlock.
const deadlockTries = 5

// retryDeadlock runs fn in a transaction of db (a savepoint when db is a
// transaction) and runs it again, up to deadlockTries times, when
// PostgreSQL ended it to break a deadlock (SQLSTATE 40P01). An operation
// on a whole workflow locks the workflow's row and then its nodes, where a
// finish locks a node and then its workflow's row: a deadlock between the
// two is detected after deadlock_timeout (1 s by default) and one of them
// ended; the finisher's completer retries its own, and so does this.
func retryDeadlock(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, fn func(pgx.Tx) error) error {
	for try := 1; ; try++ {
		err := pgx.BeginFunc(ctx, db, fn)
		var pgErr *pgconn.PgError
		if try == deadlockTries || !errors.As(err, &pgErr) || pgErr.Code != "40P01" || ctx.Err() != nil {
			return err
		}
	}
}
