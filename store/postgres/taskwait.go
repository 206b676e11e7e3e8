package postgres

// Waits on tasks (spi.WaitForTasks, see migrations/0033_task_waits.up.sql):
// a run registers its wait on tasks (WaitTasks), then its completion puts
// it to sleep; each statement that ends a waited-on task for good counts
// it off its waiters in the same statement (waitsEnded).
//
// Every lock is taken in one order: the targets, then the rows of
// stint_task_wait, then the waiters. A registration locks its targets
// first and its own row last; a target's finish holds the target, deletes
// its rows and then locks their waiters in id order.

import (
	"context"
	"fmt"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// waitTasksSQL registers the wait of the run of task $1 under lease $2 on
// the tasks $3 (distinct, not $1). It locks them in id order first (FOR NO
// KEY UPDATE, which a finish's update of the row waits for): the rows it
// returns are their newest versions, so a target whose finish committed
// while the statement waited for its lock is found ended, and a finish
// that comes after waits for this statement's transaction and then finds
// waited_on set, and the rows, since its lookup of the rows
// (stint_task_waits_ended) takes a snapshot of its own. For each target
// not ended for good it stores a row under the lease (replacing one of an
// earlier lease) and sets the target's waited_on; the task's
// tasks_pending counts them. Nothing is stored unless every target exists
// and the lease holds the running task as of the statement's snapshot; a
// lease lost after that leaves rows of a lease the task no longer has,
// which count for nothing. It returns the count, -1 when nothing was
// stored, and the targets that do not exist.
const waitTasksSQL = `
WITH t AS MATERIALIZED (
    SELECT id, status IN ('success', 'failure') AND schedule_not_before IS NULL AS ended
    FROM stint_task WHERE id = ANY($3::text[]) ORDER BY id FOR NO KEY UPDATE
), ok AS MATERIALIZED (
    SELECT (SELECT count(*) FROM t) = cardinality($3::text[])
        AND EXISTS (SELECT 1 FROM stint_task WHERE id = $1 AND lease = $2 AND status = 'running') AS ok
), ins AS (
    INSERT INTO stint_task_wait (waiter, target, lease)
    SELECT $1, t.id, $2 FROM t, ok WHERE ok.ok AND NOT t.ended
    ON CONFLICT (waiter, target) DO UPDATE SET lease = excluded.lease
    RETURNING target
), marked AS (
    UPDATE stint_task x SET waited_on = true
    FROM t, ok
    WHERE ok.ok AND x.id = ANY(ARRAY[t.id]) AND NOT t.ended AND NOT x.waited_on
), me AS (
    UPDATE stint_task w SET tasks_pending = (SELECT count(*) FROM ins)
    FROM ok
    WHERE ok.ok AND w.id = $1 AND w.lease = $2 AND w.status = 'running'
    RETURNING w.tasks_pending
)
SELECT coalesce((SELECT tasks_pending FROM me), -1), ARRAY(SELECT unnest($3::text[]) EXCEPT SELECT id FROM t ORDER BY 1)`

// WaitTasks registers a run's wait on tasks; see store.TaskWaits.
func (s *Store) WaitTasks(ctx context.Context, r store.LeaseRef, ids []api.TaskID) (int, []api.TaskID, error) {
	targets := make(textArray, len(ids))
	for i, id := range ids {
		targets[i] = string(id)
	}
	var pending int
	var missing []string
	if err := indexedRow(ctx, s.pool, waitTasksSQL, string(r.ID), uuid(r.Lease), targets).Scan(&pending, &missing); err != nil {
		return 0, nil, fmt.Errorf("wait for tasks: task %s: %w", r.ID, err)
	}
	if len(missing) > 0 {
		out := make([]api.TaskID, len(missing))
		for i, id := range missing {
			out[i] = api.TaskID(id)
		}
		return 0, out, nil
	}
	if pending < 0 {
		return 0, nil, fmt.Errorf("wait for tasks: task %s: %w", r.ID, api.ErrHalt)
	}
	return pending, nil, nil
}

// waitsEnded returns the CTEs (named waits_*) that count the tasks of
// ended, a query of the ids of tasks that ended for good or went, off the
// waits on them, for the statement that ended them. It deletes their rows
// of stint_task_wait through stint_task_waits_ended, whose snapshot is
// taken once the statement holds the tasks' rows: it sees the rows of a
// registration that committed after the statement began (the tasks'
// newest versions said waited_on; the statement's own snapshot would miss
// them). The function is not called when ended is empty, as it is for
// tasks nobody waits on. The waiters are locked in id order; each one's
// count drops by its rows of the lease it still has (rows of an earlier
// lease count for nothing), computed in the SET from the row as the
// update finds it, so under its lock (a condition in the WHERE would be
// tested on the version the statement's snapshot sees, which may predate
// the registration): of finishes of its targets at once, exactly the one
// that brings it to zero makes a sleeping waiter due now (held: due once
// released) and clears its count, with its claim hint and a notification
// to the claimers. A waiter still running is only counted, down to zero:
// its completion finds the count at zero and makes it due (see
// finishSQL). A waiter that ended meanwhile (failed by hand, cancelled)
// keeps its count, which its next claim clears.
func waitsEnded(ended string) string {
	return `waits_gone AS MATERIALIZED (
    SELECT g.waiter, array_agg(g.lease) AS leases
    FROM (SELECT ARRAY(` + ended + `) AS ids) e, LATERAL stint_task_waits_ended(e.ids) g
    WHERE cardinality(e.ids) > 0
    GROUP BY g.waiter
), waits_locked AS MATERIALIZED (
    SELECT p.id FROM stint_task p WHERE p.id = ANY(ARRAY(SELECT waiter FROM waits_gone)) ORDER BY p.id FOR NO KEY UPDATE
), waits_woken AS (
    UPDATE stint_task p SET (tasks_pending, schedule_not_before, held_due) = (
        SELECT CASE WHEN v.n = 0 THEN p.tasks_pending WHEN v.left > 0 THEN v.left WHEN p.status = 'running' THEN 0 END,
            CASE WHEN v.n > 0 AND v.left <= 0 AND p.status = 'scheduled' THEN now() ELSE p.schedule_not_before END,
            CASE WHEN v.n > 0 AND v.left <= 0 AND p.status = 'held' THEN now() ELSE p.held_due END
        FROM (SELECT c.n, p.tasks_pending - c.n AS left FROM (
            SELECT count(*) FILTER (WHERE l = p.lease AND p.tasks_pending > 0 AND p.status IN ('running', 'scheduled', 'held')) AS n
            FROM unnest(e.leases) AS l) c) v)
    FROM (SELECT g.waiter, g.leases FROM waits_gone g JOIN waits_locked l ON l.id = g.waiter) e
    WHERE p.id = ANY(ARRAY[e.waiter])
    RETURNING p.id, p.behavior, p.priority, p.schedule_not_before, p.group_key, p.status,
        p.status = 'scheduled' AND p.tasks_pending IS NULL AND p.schedule_not_before = now() AS woke,
        CASE WHEN p.status = 'scheduled' AND p.tasks_pending IS NULL AND p.schedule_not_before = now()
            THEN pg_notify('` + store.ChannelDue + `', '') END AS told
), waits_due AS (` + dueInsert("(SELECT * FROM waits_woken WHERE woke) w") + `
)`
}

// waitsGoneSQL ends the waits on the tasks $1, which went (a remove), as
// their ends would (see waitsEnded), and deletes their own waits.
var waitsGoneSQL = `
WITH ` + waitsEnded(`SELECT unnest($1::text[])`) + `, waits_left AS (` + waitsLeft(`SELECT unnest($1::text[])`) + `)
SELECT count(*) FROM waits_woken`

// waitsLeft returns the statement, for a CTE beside waitsEnded(gone), that
// deletes the waits of the tasks of gone (a query of their ids) on tasks
// that did not go with them: stint_task_waits_ended deletes the others, as
// a later command of the statement, whose rows a delete of the statement's
// own would fail on.
func waitsLeft(gone string) string {
	return `DELETE FROM stint_task_wait v WHERE v.waiter = ANY(ARRAY(` + gone + `)) AND v.target <> ALL(ARRAY(` + gone + `))`
}

// waitsOfDeleted is the CTE of the statements that delete finished tasks
// (d) and their workflows' nodes (nodes) that deletes their waits. Their
// waits as targets went with their ends.
const waitsOfDeleted = `
    DELETE FROM stint_task_wait v WHERE v.waiter = ANY(ARRAY(SELECT id FROM d UNION ALL SELECT id FROM nodes))`

// finishWaitsApart records cs as finishIsolating does, the completions of
// runs that registered a wait on tasks (store.Completion.WaitTasks) by a
// statement of their own, after the others': in one statement with the
// finish of one of its targets, a waiter's row would be written twice,
// and the target's count off it lost (a statement skips a row it wrote
// already).
func (s *Store) finishWaitsApart(ctx context.Context, cs []store.Completion, ok []bool, st *starts) error {
	var waits []int
	for i, c := range cs {
		if c.WaitTasks {
			waits = append(waits, i)
		}
	}
	if len(waits) == 0 || len(waits) == len(cs) {
		return s.finishIsolating(ctx, cs, ok, st)
	}
	parts := [2][]int{make([]int, 0, len(cs)-len(waits)), waits}
	for i, c := range cs {
		if !c.WaitTasks {
			parts[0] = append(parts[0], i)
		}
	}
	for _, part := range parts {
		sub, held := make([]store.Completion, len(part)), make([]bool, len(part))
		for j, i := range part {
			sub[j] = cs[i]
		}
		if err := s.finishIsolating(ctx, sub, held, st); err != nil {
			return err
		}
		for j, i := range part {
			ok[i] = held[j]
		}
	}
	return nil
}
