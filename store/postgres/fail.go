package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// failSQL fails a waiting task for good: a scheduled or held task, or one
// that succeeded or failed and waits for its next run (a retry or a
// recurrence). A running task, or one that finished for good, matches no
// row. The task's claim hint goes stale (it no longer matches a waiting
// task) and is dropped by the claim that finds it. The failure counts in
// the history's current bucket as a failure that is not retried, so that
// the dashboard charts tasks failed by hand with those whose runs failed.
var failSQL = `
WITH u AS (
    UPDATE stint_task SET status = 'failure', error = $2::jsonb, errors = errors + 1,
        schedule_not_before = NULL, held_due = NULL, waiting_children = false,
        resubmit = false, resubmit_due = NULL, finished_at = now(), updated_at = now()
    WHERE id = $1 AND (status IN ('scheduled', 'held') OR (status IN ('success', 'failure') AND schedule_not_before IS NOT NULL))
      AND behavior <> '` + string(api.WorkflowBehavior) + `'
    RETURNING id, behavior, parent_id
), feed AS (` + feedInsert("u", "'failure'::text", "true") + `
), ` + waitsEnded("SELECT id FROM u") + `, history AS (
    INSERT INTO stint_history (bucket, behavior, failed)
    SELECT ` + historyBucket("now()") + `, behavior, 1 FROM u
    ON CONFLICT (bucket, behavior) DO UPDATE SET failed = stint_history.failed + 1
)
SELECT coalesce(parent_id, '') FROM u`

// Fail fails a task that waits to run, for good, with e; see store.Store.
func (s *Store) Fail(ctx context.Context, id api.TaskID, e *api.TaskError) error {
	raw, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("fail task %s: encode error: %w", id, err)
	}
	matched := false
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var parent string
		err := tx.QueryRow(ctx, failSQL, string(id), string(raw)).Scan(&parent)
		if isNoRows(err) {
			return nil
		}
		if err != nil {
			return err
		}
		matched = true
		// The task ended for good: it counts off its parent's pending
		// children as any finish does, and a workflow node's dependents
		// learn it failed.
		if parent != "" {
			if _, err := nodesEnded(ctx, tx, []string{parent}, []string{string(id)}, nil, nil, false); err != nil {
				return err
			}
		}
		// Wake awaiters, in this transaction so that they see the failure.
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, store.ChannelFinished, string(id))
		return err
	})
	if err != nil {
		return fmt.Errorf("fail task %s: %w", id, err)
	}
	if matched {
		return nil
	}
	var status string
	var due, workflow bool
	err = s.pool.QueryRow(ctx, `SELECT status, schedule_not_before IS NOT NULL, behavior = $2 FROM stint_task WHERE id = $1`,
		string(id), string(api.WorkflowBehavior)).Scan(&status, &due, &workflow)
	switch {
	case isNoRows(err):
		return api.ErrNotFound
	case err != nil:
		return fmt.Errorf("fail task %s: %w", id, err)
	case workflow:
		return fmt.Errorf("fail task %s: it is a workflow, whose outcome its nodes decide: cancel the workflow: %w", id, api.ErrConflict)
	case status == string(api.StatusRunning):
		return fmt.Errorf("fail task %s: it is running; only a waiting task can be failed by hand (remove it to halt its run): %w", id, api.ErrConflict)
	case due || status == string(api.StatusHeld) || status == string(api.StatusScheduled):
		return fmt.Errorf("fail task %s: it changed meanwhile (it is %s now): %w", id, status, api.ErrConflict)
	default:
		return fmt.Errorf("fail task %s: it has finished for good (%s): %w", id, status, api.ErrConflict)
	}
}
