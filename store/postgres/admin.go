package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// querier is what a pool and a transaction have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	batcher
}

// database is a querier that can also begin a transaction: the pool, or a
// transaction, whose Begin makes a savepoint.
type database interface {
	querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// spawnLockSQL locks the parent $1 under its lease $2, and then, in id
// order, the tasks of $3 that are its children and ended for good, which
// a resubmitting spawn runs again: their ends were counted off the
// parent, which waits for them once more, as Retry makes it. It returns
// whether the parent was locked (a stale parent spawns nothing, and locks
// no child) and how many children it locked: locked, none of them changes
// before the spawn's submit does, and the parent's count of pending
// children cannot race its finish.
var spawnLockSQL = `WITH p AS (
    SELECT 1 FROM stint_task WHERE id = $1 AND lease = $2 AND status = 'running' FOR UPDATE
)
SELECT EXISTS (SELECT 1 FROM p), (SELECT count(*) FROM (SELECT t.id FROM stint_task t
    WHERE EXISTS (SELECT 1 FROM p) AND t.id = ANY($3::text[]) AND t.parent_id = $1 AND ` + finishedForGood + ` AND NOT t.resubmit
    ORDER BY t.id COLLATE "C" FOR NO KEY UPDATE) r)`

// Spawn submits children of a running parent, fenced by its lease, in
// three round trips: BEGIN with the locks (spawnLockSQL), the submit, and
// the parent's count of pending children with the COMMIT.
func (s *Store) Spawn(ctx context.Context, parent store.LeaseRef, tasks []store.NewTask) ([]api.Submission, error) {
	var again []string
	for i := range tasks {
		tasks[i].ParentID = parent.ID
		if !tasks[i].Share {
			again = append(again, string(tasks[i].ID))
		}
	}
	var out []api.Submission
	err := s.connTx(ctx, func(c *pgx.Conn) error {
		var locked bool
		var pending int // children of the parent that run again, then new ones
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(spawnLockSQL, string(parent.ID), uuid(parent.Lease), textArray(again)).QueryRow(func(r pgx.Row) error {
			return r.Scan(&locked, &pending)
		})
		if err := c.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if !locked {
			return api.ErrHalt
		}
		var err error
		if out, _, err = submit(ctx, c, tasks, false, "", false); err != nil {
			return err
		}
		for _, sub := range out {
			if sub.Created {
				pending++
			}
		}
		b = &pgx.Batch{}
		if pending > 0 {
			b.Queue(`UPDATE stint_task SET children_pending = children_pending + $2 WHERE id = $1`, string(parent.ID), pending)
		}
		b.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error { return committed(tag, nil) })
		return c.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return nil, fmt.Errorf("spawn children of %s: %w", parent.ID, submitRefused(err))
	}
	return out, nil
}

// Remove deletes a task; see store.Store. A workflow goes with its nodes;
// a node of one only with its workflow (its dependents would wait for it
// for ever): api.ErrConflict.
func (s *Store) Remove(ctx context.Context, id api.TaskID) (api.Task, error) {
	var t api.Task
	err := retryDeadlock(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		t, err = scanTask(tx.QueryRow(ctx, `SELECT `+taskColumns+` FROM stint_task WHERE id = $1 FOR UPDATE`, string(id)))
		if err != nil {
			return err
		}
		if t.Behavior == api.WorkflowBehavior {
			var n int
			return tx.QueryRow(ctx, removeWorkflowSQL, string(id)).Scan(&n)
		}
		var node bool
		if err := tx.QueryRow(ctx, `SELECT workflow_node IS NOT NULL FROM stint_task WHERE id = $1`, string(id)).Scan(&node); err != nil {
			return err
		}
		if node {
			return fmt.Errorf("it is a node of workflow %s: remove or cancel the workflow: %w", t.ParentID, api.ErrConflict)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM stint_task WHERE id = $1`, string(id)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `WITH attempts AS (DELETE FROM stint_attempt WHERE task_id = $1),
			events AS (`+eventsDelete("ARRAY[$1]")+`), signals AS (`+signalsDelete("ARRAY[$1]")+`) `+stepsDelete("ARRAY[$1]"),
			string(id)); err != nil {
			return err
		}
		// Runs that wait on it count it as ended, as a parent its child.
		if _, err := tx.Exec(ctx, waitsGoneSQL, textArray{string(id)}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO stint_change (task_ids, behaviors, statuses, parent_ids, finals)
			VALUES (ARRAY[$1], ARRAY[$2], ARRAY['removed'], ARRAY[nullif($3, '')], ARRAY[true])`,
			string(t.ID), string(t.Behavior), string(t.ParentID)); err != nil {
			return err
		}
		if t.ParentID != "" && !t.Finished() {
			if _, err := tx.Exec(ctx, childrenEndedSQL, []string{string(t.ParentID)}); err != nil {
				return err
			}
		}
		// Its children are orphans now: their ends must not be counted off
		// a task submitted later under the same id.
		if _, err := tx.Exec(ctx, `UPDATE stint_task SET parent_id = NULL WHERE parent_id = $1`, string(id)); err != nil {
			return err
		}
		// Wake awaiters (they find the task gone) and the running node.
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, store.ChannelFinished, string(id)); err != nil {
			return err
		}
		if t.Status == api.StatusRunning {
			_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, store.ChannelRemoved, string(id))
		}
		return err
	})
	if err == api.ErrNotFound {
		return t, err
	}
	if err != nil {
		return t, fmt.Errorf("remove task %s: %w", id, err)
	}
	return t, nil
}

// transition runs a single-row state change and tells ErrNotFound from
// ErrConflict when no row matched.
func (s *Store) transition(ctx context.Context, verb string, id api.TaskID, query string) error {
	tag, err := s.pool.Exec(ctx, query, string(id))
	if err != nil {
		return fmt.Errorf("%s task %s: %w", verb, id, err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	var status string
	err = s.pool.QueryRow(ctx, `SELECT status FROM stint_task WHERE id = $1`, string(id)).Scan(&status)
	if isNoRows(err) {
		return api.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("%s task %s: %w", verb, id, err)
	}
	return fmt.Errorf("%s task %s: it is %s: %w", verb, id, status, api.ErrConflict)
}

// kindSQL reads whether task $1 is a workflow's own task, and the
// workflow of a node.
const kindSQL = `SELECT behavior = '` + string(api.WorkflowBehavior) + `', CASE WHEN workflow_node IS NOT NULL THEN parent_id ELSE '' END
FROM stint_task WHERE id = $1`

// taskKind reads whether task id is a workflow's own task (workflow), or
// else a node of the workflow of.
func (s *Store) taskKind(ctx context.Context, id api.TaskID) (workflow bool, of api.TaskID, err error) {
	err = s.pool.QueryRow(ctx, kindSQL, string(id)).Scan(&workflow, &of)
	if isNoRows(err) {
		return false, "", api.ErrNotFound
	}
	return workflow, of, err
}

// Hold keeps a scheduled (or retrying) task from being claimed. It keeps
// the task's due time for Release. A parent that waits for its children
// keeps waiting while held. A workflow's own task holds the workflow.
func (s *Store) Hold(ctx context.Context, id api.TaskID) error {
	if workflow, _, err := s.taskKind(ctx, id); err != nil || workflow {
		return s.orWorkflow(ctx, err, "hold", id, s.HoldWorkflow)
	}
	return s.transition(ctx, "hold", id, `
		WITH u AS (
		    UPDATE stint_task SET status = 'held', held_due = schedule_not_before, schedule_not_before = NULL,
		        executed_at = NULL, updated_at = now()
		    WHERE id = $1 AND (status = 'scheduled' OR (status IN ('success', 'failure') AND schedule_not_before IS NOT NULL))
		      AND behavior <> '`+string(api.WorkflowBehavior)+`'
		    RETURNING id, behavior, parent_id)
		`+feedInsert("u", "'held'::text", "false"))
}

// orWorkflow ends an operation on task id whose kind was read with err:
// err when it is not nil, else op, the operation on the workflow id.
func (s *Store) orWorkflow(ctx context.Context, err error, verb string, id api.TaskID, op func(context.Context, api.TaskID) error) error {
	if errors.Is(err, api.ErrNotFound) {
		return err
	}
	if err != nil {
		return fmt.Errorf("%s task %s: %w", verb, id, err)
	}
	return op(ctx, id)
}

// Release makes a held task due at the due time it had when it was held,
// or at the time its last child ended while it was held: at once if that
// time has passed. A workflow's own task releases the workflow.
func (s *Store) Release(ctx context.Context, id api.TaskID) error {
	if workflow, _, err := s.taskKind(ctx, id); err != nil || workflow {
		return s.orWorkflow(ctx, err, "release", id, s.ReleaseWorkflow)
	}
	return s.transition(ctx, "release", id, `
		WITH u AS (
		    UPDATE stint_task SET status = 'scheduled', schedule_not_before = coalesce(held_due, now()), held_due = NULL,
		        updated_at = now()
		    WHERE id = $1 AND status = 'held' AND behavior <> '`+string(api.WorkflowBehavior)+`'
		    RETURNING id, behavior, parent_id, priority, schedule_not_before, group_key, status
		), due AS (`+dueInsert("u")+`)
		`+feedInsert("u", "'scheduled'::text", "false"))
}

// Retry schedules a task that failed for good to run again. A
// workflow's own task retries the workflow; a node retries its workflow
// from that node (see retryNodes).
func (s *Store) Retry(ctx context.Context, id api.TaskID) error {
	workflow, of, err := s.taskKind(ctx, id)
	switch {
	case err != nil || workflow:
		return s.orWorkflow(ctx, err, "retry", id, func(ctx context.Context, id api.TaskID) error {
			_, err := s.RetryWorkflow(ctx, id)
			return err
		})
	case of != "":
		if _, err := s.retry(ctx, of, id); err != nil {
			return fmt.Errorf("retry task %s: %w", id, err)
		}
		return nil
	}
	return s.transition(ctx, "retry", id, `
		WITH u AS (
		    UPDATE stint_task SET status = 'scheduled', schedule_not_before = now(), executed_at = NULL,
		        finished_at = NULL, attempt = 0, errors = 0, updated_at = now()
		    WHERE id = $1 AND status = 'failure' AND schedule_not_before IS NULL
		      AND workflow_node IS NULL AND behavior <> '`+string(api.WorkflowBehavior)+`'
		    RETURNING id, behavior, parent_id, priority, schedule_not_before, group_key, status
		), pending AS (
		    -- The child's end was counted off its parent: it is pending
		    -- again, so that the parent waits for it once more.
		    UPDATE stint_task p SET children_pending = p.children_pending + 1
		    FROM u WHERE p.id = u.parent_id
		), due AS (`+dueInsert("u")+`)
		`+feedInsert("u", "'scheduled'::text", "false"))
}

// HoldGroup holds a group key.
func (s *Store) HoldGroup(ctx context.Context, key string) error {
	err := s.changeParking(ctx, "", &key, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO stint_hold (group_key) VALUES ($1) ON CONFLICT DO NOTHING`, key)
		return err
	})
	if err != nil {
		return fmt.Errorf("hold group %q: %w", key, err)
	}
	return nil
}

// ReleaseGroup lifts a group hold and wakes the claimers.
func (s *Store) ReleaseGroup(ctx context.Context, key string) error {
	err := s.changeParking(ctx, "", &key, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `WITH d AS (DELETE FROM stint_hold WHERE group_key = $1 RETURNING 1)
			SELECT pg_notify($2, '') FROM d`, key, store.ChannelDue)
		return err
	})
	if err != nil {
		return fmt.Errorf("release group %q: %w", key, err)
	}
	return nil
}

// HeldGroups lists the held group keys.
func (s *Store) HeldGroups(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT group_key FROM stint_hold ORDER BY group_key`)
	if err != nil {
		return nil, fmt.Errorf("list held groups: %w", err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list held groups: %w", err)
	}
	return keys, nil
}

// SetBehavior stores a behavior's runtime settings and wakes the claimers.
func (s *Store) SetBehavior(ctx context.Context, b store.BehaviorSettings) error {
	var leaseMS *int64
	if b.Lease > 0 {
		ms := b.Lease.Milliseconds()
		leaseMS = &ms
	}
	err := s.changeParking(ctx, string(b.Behavior), nil, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `
			WITH u AS (
			    INSERT INTO stint_behavior (behavior, paused, lease_ms) VALUES ($1, $2, $3)
			    ON CONFLICT (behavior) DO UPDATE SET paused = $2, lease_ms = $3, updated_at = now()
			    RETURNING 1)
			SELECT pg_notify($4, '') FROM u`, string(b.Behavior), b.Paused, leaseMS, store.ChannelDue)
		return err
	})
	if err != nil {
		return fmt.Errorf("set behavior %s: %w", b.Behavior, err)
	}
	return nil
}

// Behaviors lists the behaviors with runtime settings.
func (s *Store) Behaviors(ctx context.Context) ([]store.BehaviorSettings, error) {
	rows, err := s.pool.Query(ctx, `SELECT behavior, paused, coalesce(lease_ms, 0) FROM stint_behavior ORDER BY behavior`)
	if err != nil {
		return nil, fmt.Errorf("list behaviors: %w", err)
	}
	var out []store.BehaviorSettings
	var b store.BehaviorSettings
	var ms int64
	if _, err := pgx.ForEachRow(rows, []any{&b.Behavior, &b.Paused, &ms}, func() error {
		b.Lease = time.Duration(ms) * time.Millisecond
		out = append(out, b)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("list behaviors: %w", err)
	}
	return out, nil
}

// PendingCount counts tasks of a behavior due within lookAhead.
func (s *Store) PendingCount(ctx context.Context, behavior api.BehaviorID, lookAhead time.Duration) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(DISTINCT d.id) FROM stint_due d
		JOIN stint_task t ON `+hintMatches("t", "d")+`
		WHERE d.behavior = $1 AND d.due <= now() + $2 * interval '1 microsecond'`,
		string(behavior), lookAhead.Microseconds()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count pending %s: %w", behavior, err)
	}
	return n, nil
}

// deleteFinishedSQL selects a batch of a behavior's finished tasks past
// the retention $3 (microseconds) through the index stint_task_created: a
// task that finished that long ago was created longer ago still, so the
// range on created_at holds them all. A workflow's nodes go with their
// workflow (deleteNodes), never before it: a node's dependents may read
// its result for as long as the workflow lives, and the index leaves the
// nodes out.
const deleteFinishedSQL = `
WITH d AS (
    DELETE FROM stint_task WHERE id = ANY(ARRAY(
        SELECT id FROM stint_task
        WHERE behavior = $1 AND retention_us IS NULL AND created_at < now() - $3 * interval '1 microsecond'
          AND status = $2 AND schedule_not_before IS NULL
          AND finished_at < now() - $3 * interval '1 microsecond' AND workflow_node IS NULL
        LIMIT $4
        FOR UPDATE SKIP LOCKED))
    RETURNING id, behavior
)` + deleteNodes + `
SELECT count(*) FROM d`

// deleteNodes ends the statements that delete finished tasks d (a CTE
// with id and behavior): it deletes the nodes and edges of the workflows
// among them, and the recorded runs, the steps, the events and the
// signals of all.
// Both find their rows through an index by an array of ids (= ANY of an
// ARRAY), never by a join the planner may make a scan of the table.
const deleteNodes = `, nodes AS (
    DELETE FROM stint_task n
    WHERE n.parent_id = ANY(ARRAY(SELECT id FROM d WHERE behavior = '` + string(api.WorkflowBehavior) + `'))
      AND n.workflow_node IS NOT NULL
    RETURNING n.id
), edges AS (
    DELETE FROM stint_dependency e WHERE e.task_id = ANY(ARRAY(SELECT id FROM nodes))
), attempts AS (` + attemptsDelete + `
), steps AS (` + stepsOfDeleted + `
), events AS (` + eventsOfDeleted + `
), waits AS (` + waitsOfDeleted + `
), signals AS (` + signalsOfDeleted + `
)`

// DeleteFinished deletes a batch of old finished tasks; see store.Store.
func (s *Store) DeleteFinished(ctx context.Context, p store.DeleteFinishedParams) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, deleteFinishedSQL, string(p.Behavior), string(p.Status), p.OlderThan.Microseconds(), p.Limit).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("delete finished %s tasks of %s: %w", p.Status, p.Behavior, err)
	}
	return n, nil
}

// deleteExpiredSQL selects a batch of finished tasks past their own
// retention through the index stint_task_expiry, whose key (created_at
// plus the retention) is at most the time the task may go. A workflow's
// node with a retention of its own goes once that passed after its
// workflow ended, never before: while the workflow runs, its dependents'
// rules and their runs' NodeResult read it, and a retry of the workflow
// counts it. The workflow's row is share-locked (and the node skipped
// when it is locked), so that a retry, which locks it to run nodes again,
// reads the nodes either before or after they went. The workflow is found
// per candidate node (a subplan: a locking subquery is not made a join),
// so that the nodes are found through stint_task_expiry alone, never by
// a walk of every child in stint_task_parent; they are looked for only
// when the other tasks do not fill the batch, as the expired tasks past
// those of the batch would be read again for every batch of a backlog.
// A node goes with its own edges (those to its dependencies); its
// dependents keep theirs, naming it.
const deleteExpiredSQL = `
WITH tasks AS (
    SELECT ARRAY(
        SELECT id FROM stint_task
        WHERE retention_us IS NOT NULL AND stint_expiry(created_at, retention_us) < now()
          AND status IN ('success', 'failure') AND schedule_not_before IS NULL
          AND stint_expiry(finished_at, retention_us) < now() AND workflow_node IS NULL
        LIMIT $1
        FOR UPDATE SKIP LOCKED) AS ids
), d AS (
    DELETE FROM stint_task WHERE id = ANY((SELECT ids FROM tasks) || ARRAY(
        SELECT n.id FROM stint_task n
        WHERE n.retention_us IS NOT NULL AND stint_expiry(n.created_at, n.retention_us) < now()
          AND n.status IN ('success', 'failure') AND n.schedule_not_before IS NULL AND n.workflow_node IS NOT NULL
          AND EXISTS (SELECT 1 FROM stint_task w WHERE w.id = n.parent_id
              AND w.status IN ('success', 'failure') AND w.schedule_not_before IS NULL
              AND stint_expiry(w.finished_at, n.retention_us) < now()
              FOR SHARE SKIP LOCKED)
        LIMIT $1 - cardinality((SELECT ids FROM tasks))
        FOR UPDATE SKIP LOCKED))
    RETURNING id, behavior, status, workflow_node IS NOT NULL AS node)` + deleteNodes + `, own_edges AS (
    DELETE FROM stint_dependency e WHERE e.task_id = ANY(ARRAY(SELECT id FROM d WHERE node))
)
SELECT behavior || '/' || status, count(*) FROM d GROUP BY 1`

// DeleteExpired deletes a batch of finished tasks past their own
// retention; see store.Store.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (map[string]int, error) {
	rows, err := s.pool.Query(ctx, deleteExpiredSQL, limit)
	if err != nil {
		return nil, fmt.Errorf("delete expired tasks: %w", err)
	}
	out := map[string]int{}
	var key string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&key, &n}, func() error {
		out[key] = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("delete expired tasks: %w", err)
	}
	return out, nil
}
