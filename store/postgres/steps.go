package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
)

// A task's steps are its rows of stint_step numbered 1 to its step (see
// migrations/0029_steps.up.sql); a row above it is none of the task's.

// stepKept is the CTE of checkpointSQL that keeps the progress of u (its
// updated task, with the step it numbered) as a step when $4 is set, over
// a row above the task's steps.
const stepKept = `
    INSERT INTO stint_step (task_id, step, progress, at)
    SELECT id, step, progress, statement_timestamp() FROM u WHERE $4::boolean
    ON CONFLICT (task_id, step) DO UPDATE SET progress = EXCLUDED.progress, at = EXCLUDED.at`

// stepsOfDeleted is the CTE of the statements that delete finished tasks
// (d) and their workflows' nodes (nodes) that deletes their steps.
const stepsOfDeleted = `
    DELETE FROM stint_step s WHERE s.task_id = ANY(ARRAY(SELECT id FROM d UNION ALL SELECT id FROM nodes))`

// stepsDelete returns the statement that deletes the steps of the tasks
// whose ids the array expression ids holds, found by the primary key.
func stepsDelete(ids string) string {
	return `DELETE FROM stint_step s WHERE s.task_id = ANY(` + ids + `)`
}

// stepsSQL reads the steps of task $1, by number.
const stepsSQL = `SELECT s.step, s.progress, s.at FROM stint_step s
WHERE s.task_id = $1 AND s.step <= (SELECT coalesce(t.step, 0) FROM stint_task t WHERE t.id = $1)
ORDER BY s.step`

// Steps returns the steps kept of a task; see store.Store.
func (s *Store) Steps(ctx context.Context, id api.TaskID) ([]api.Step, error) {
	var out []api.Step
	err := s.reading(ctx, func(db *pgxpool.Pool, _ bool) error {
		out = nil
		var st api.Step
		var progress []byte
		_, err := indexed(ctx, db, func(rows pgx.Rows) error {
			_, err := pgx.ForEachRow(rows, []any{&st.N, &progress, &st.At}, func() error {
				st.Progress = copyJSON(progress)
				out = append(out, st)
				return nil
			})
			return err
		}, stepsSQL, string(id))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read steps of task %s: %w", id, err)
	}
	return out, nil
}

// LastStep returns the number of a task's last step; see store.Store.
func (s *Store) LastStep(ctx context.Context, id api.TaskID) (int, error) {
	var n int
	err := indexedRow(ctx, s.pool, `SELECT coalesce(step, 0) FROM stint_task WHERE id = $1`, string(id)).Scan(&n)
	if err != nil && !isNoRows(err) {
		return 0, fmt.Errorf("read the step of task %s: %w", id, err)
	}
	return n, nil
}

// stepSourceSQL locks task $1 (FOR UPDATE or FOR SHARE, appended) and
// reads what a rewind or a fork from its step $2 must check: its state,
// its kind, and whether the step is one of its steps.
const stepSourceSQL = `SELECT status, status IN ('success', 'failure') AND schedule_not_before IS NULL, behavior = '` + string(api.WorkflowBehavior) + `',
    CASE WHEN workflow_node IS NOT NULL THEN coalesce(parent_id, '') END, coalesce(step, 0),
    EXISTS (SELECT 1 FROM stint_step s WHERE s.task_id = $1 AND s.step = $2)
FROM stint_task WHERE id = $1 `

// stepSource is what stepSourceSQL reads of the task a rewind or a fork
// starts from.
type stepSource struct {
	status   api.Status
	final    bool    // it has an outcome and waits for no next run
	workflow bool    // it is a workflow's own task
	of       *string // the workflow of a node
	last     int     // its last step
	found    bool    // a row of the step exists
}

// lockStepSource locks task id for a rewind (forUpdate) or a fork from its
// step n and checks that the operation may start there: the task
// exists, is no workflow nor node of one, is not running (nor, for a
// rewind, waiting to run), and has step n.
func lockStepSource(ctx context.Context, tx pgx.Tx, id api.TaskID, n int, forUpdate bool) error {
	lock := "FOR SHARE"
	if forUpdate {
		lock = "FOR UPDATE"
	}
	var src stepSource
	var status string
	err := tx.QueryRow(ctx, stepSourceSQL+lock, string(id), n).Scan(&status, &src.final, &src.workflow, &src.of, &src.last, &src.found)
	if isNoRows(err) {
		return api.ErrNotFound
	}
	if err != nil {
		return err
	}
	src.status = api.Status(status)
	switch {
	case src.workflow:
		return fmt.Errorf("it is a workflow, whose nodes decide its runs: retry the workflow or one of its nodes: %w", api.ErrConflict)
	case src.of != nil:
		return fmt.Errorf("it is a node of workflow %s, whose rules decide what runs again: retry the node: %w", *src.of, api.ErrConflict)
	case src.status == api.StatusRunning:
		return fmt.Errorf("it is running: %w", api.ErrConflict)
	case forUpdate && !src.final:
		return fmt.Errorf("it is %s and waits to run: only a task that finished for good runs again from a step: %w", src.status, api.ErrConflict)
	case !src.found || n > src.last:
		if src.last == 0 {
			return fmt.Errorf("it has no steps (its behavior keeps them with spi.Policy.KeepSteps): %w", api.ErrNotFound)
		}
		return fmt.Errorf("it has no step %d (its steps are 1 to %d): %w", n, src.last, api.ErrNotFound)
	}
	return nil
}

// rewindSQL runs task $1 again from its step $2 (checked by
// lockStepSource): due at once, with the step's progress and a fresh count
// of attempts, and without the steps after it. As a retry, a child's end
// was counted off its parent: it is pending again.
var rewindSQL = `
WITH u AS (
    UPDATE stint_task SET status = 'scheduled', schedule_not_before = now(), executed_at = NULL, finished_at = NULL,
        attempt = 0, errors = 0, progress = (SELECT s.progress FROM stint_step s WHERE s.task_id = $1 AND s.step = $2),
        step = $2, updated_at = now()
    WHERE id = $1
    RETURNING id, behavior, parent_id, priority, schedule_not_before, group_key, status
), dropped AS (
    DELETE FROM stint_step s WHERE s.task_id = $1 AND s.step > $2
), pending AS (
    UPDATE stint_task p SET children_pending = p.children_pending + 1
    FROM u WHERE p.id = u.parent_id
), due AS (` + dueInsert("u") + `)
` + feedInsert("u", "'scheduled'::text", "false")

// Rewind runs a finished task again from a step; see store.Store.
func (s *Store) Rewind(ctx context.Context, id api.TaskID, step int) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockStepSource(ctx, tx, id, step, true); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, rewindSQL, string(id), step)
		return err
	})
	if err != nil {
		return stepError("rewind", id, err)
	}
	return nil
}

// forkSQL stores task $3, a copy of task $1 started from its step $2
// (checked by lockStepSource), due at once, unless $3 exists, with the
// source's steps 1 to $2 (over rows above a deleted task's steps). It
// returns the new task's status, or no row when $3 exists.
var forkSQL = `
WITH s AS (
    INSERT INTO stint_task AS t (id, behavior, params, priority, schedule_not_before, group_key, retention_us, rate_uses,
        version, progress, step)
    SELECT $3, f.behavior, f.params, f.priority, now(), f.group_key, f.retention_us, f.rate_uses, f.version,
        (SELECT c.progress FROM stint_step c WHERE c.task_id = $1 AND c.step = $2), $2
    FROM stint_task f WHERE f.id = $1
    ON CONFLICT (id) DO NOTHING
    RETURNING t.id, t.behavior, t.parent_id, t.priority, t.schedule_not_before, t.group_key, t.status
), copied AS (
    INSERT INTO stint_step (task_id, step, progress, at)
    SELECT s.id, c.step, c.progress, c.at FROM s, stint_step c WHERE c.task_id = $1 AND c.step <= $2
    ON CONFLICT (task_id, step) DO UPDATE SET progress = EXCLUDED.progress, at = EXCLUDED.at
), due AS (` + dueInsert("s") + `
), feed AS (` + feedInsert("s", "status", "false") + `
)
SELECT status FROM s`

// Fork stores a copy of a task started from a step; see store.Store.
func (s *Store) Fork(ctx context.Context, id api.TaskID, step int, newID api.TaskID) (api.Submission, error) {
	sub := api.Submission{ID: newID, Created: true}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockStepSource(ctx, tx, id, step, false); err != nil {
			return err
		}
		var status string
		err := tx.QueryRow(ctx, forkSQL, string(id), step, string(newID)).Scan(&status)
		if isNoRows(err) {
			return fmt.Errorf("task %s exists: fork to a new id: %w", newID, api.ErrConflict)
		}
		sub.Status = api.Status(status)
		return err
	})
	if err != nil {
		return api.Submission{}, stepError("fork", id, err)
	}
	return sub, nil
}

// stepError is the error of a rewind or fork (op) of task id that failed
// with err: api.ErrNotFound as it is for a task that does not exist, else
// wrapped with the operation.
func stepError(op string, id api.TaskID, err error) error {
	if err == api.ErrNotFound {
		return err
	}
	return fmt.Errorf("%s task %s: %w", op, id, err)
}
