package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// finishSQL records a batch of completions, each fenced by its lease. A task
// flagged for resubmit is scheduled again at the due time that submit asked
// for (at once if it passed), flagged so that its next claim reports a
// resubmitted run; a snooze ($3 =
// 'scheduled') does not count as an attempt; a parent waiting for children
// ($7) is due at once if none is pending, else after the fallback delay;
// so is a run that waits on tasks when they all ended since it registered
// (tasks_pending, see waitTasksSQL). The tasks it ends for good that runs
// wait on are counted off their waiters' waits (waitsEnded).
// A task the batch makes due at once (resubmitted while it ran, snoozed or
// retried without a delay, a parent with no child left) wakes the
// claimers, which would otherwise find it only at their next poll.
// Awaited tasks are notified in the same transaction, so a woken awaiter
// sees the result; ids go in chunks of 50 to stay under the 8,000-byte
// payload limit. The statement returns one row: the ordinals (from 1) of
// the completions it did not record (their lease was lost: most often
// none), the parents of the tasks that finished for good, the workflow
// nodes among them, and whether each had dependents as of the statement's
// snapshot (see finishBatch). A row per completion would cost the server
// and the client more than the statement's other output. The ordinals are
// searched for only when fewer rows were written than given: the search
// scans the written rows once per completion, since the planner cannot
// know how many there are.
var finishSQL = `
WITH c AS (
    SELECT * FROM ` + unnestRows("c", "id $1::text[]", "lease $2::uuid[]", "status $3::text[]", "result $4::text[]",
	"error $5::text[]", "again_us $6::bigint[]", "wait_children $7::bool[]", "signal_wait $10::text[]", "ord ordinality") + `
), done AS (
    UPDATE stint_task t SET
        status = CASE WHEN t.resubmit OR c.status = 'scheduled' THEN 'scheduled' ELSE c.status END,
        result = CASE WHEN c.status = 'success' THEN c.result::jsonb ELSE t.result END,
        error = CASE WHEN c.status = 'failure' THEN c.error::jsonb WHEN c.status = 'success' THEN NULL ELSE t.error END,
        errors = CASE c.status WHEN 'failure' THEN t.errors + 1 WHEN 'success' THEN 0 ELSE t.errors END,
        attempt = CASE WHEN c.status = 'scheduled' THEN t.attempt - 1 ELSE t.attempt END,
        schedule_not_before = CASE
            WHEN t.resubmit THEN greatest(t.resubmit_due, now())
            WHEN c.wait_children AND t.children_pending <= 0 THEN now()
            WHEN c.again_us >= 0 AND t.tasks_pending <= 0 THEN now()
            WHEN c.again_us >= 0 THEN now() + c.again_us * interval '1 microsecond' END,
        waiting_children = c.wait_children AND t.children_pending > 0,
        tasks_pending = CASE WHEN t.tasks_pending > 0 THEN t.tasks_pending END,
        signal_wait = CASE WHEN NOT t.resubmit THEN nullif(c.signal_wait, '') END,
        lost_not_before = NULL,
        executed_at = CASE WHEN t.resubmit OR c.status = 'scheduled' THEN NULL ELSE t.executed_at END,
        finished_at = CASE WHEN c.status = 'scheduled' THEN t.finished_at ELSE now() END,
        resubmit = t.resubmit,
        resubmit_due = NULL,
        updated_at = now()
    FROM c
    WHERE t.id = ANY(ARRAY[c.id]) AND t.lease = c.lease AND t.status = 'running'
    RETURNING t.id, c.ord, t.behavior, t.status, t.parent_id, t.awaited, t.priority, t.schedule_not_before, t.group_key,
        t.status IN ('success', 'failure') AND t.schedule_not_before IS NULL AS final, t.workflow_node IS NOT NULL AS node,
        c.status = 'failure' AS run_failed, t.attempt, t.node AS run_node, t.executed_at, c.error AS run_error, t.lease,
        t.waited_on
), due AS (` + dueInsert("done") + `
), ` + waitsEnded("SELECT id FROM done WHERE final AND waited_on") + `, ` + leasesEnded + `
), attempts AS (` + attemptsInsert + `
), consuming AS MATERIALIZED (` + signalsConsumed + `
), feed AS (` + feedInsert("done", "status", "final") + `), notified AS (
    SELECT count(pg_notify('` + store.ChannelFinished + `', ids)) AS n FROM (
        SELECT string_agg(id, ',') AS ids FROM (
            SELECT id, (row_number() OVER ()) / 50 AS chunk FROM done WHERE awaited) a
        GROUP BY chunk) b
), woke AS (
    SELECT count(pg_notify('` + store.ChannelDue + `', '')) AS n FROM (
        SELECT 1 FROM done WHERE schedule_not_before <= now() LIMIT 1) d
)
SELECT ARRAY(SELECT c.ord FROM c WHERE (SELECT count(*) FROM done) < (SELECT count(*) FROM c) AND c.ord NOT IN (SELECT ord FROM done)),
    ARRAY(SELECT parent_id FROM done WHERE final AND parent_id IS NOT NULL),
    ARRAY(SELECT id FROM done WHERE final AND node),
    ARRAY(SELECT EXISTS (` + edgesByDependency("done.id") + `)
        FROM done WHERE final AND node)
FROM notified, woke`

// leasesEnded are the CTEs of finishSQL that count the runs that ended
// off their lease rows' task_count, which so says how many of a lease's
// tasks may still run under it, and drop the rows whose last run ended:
// the node's release of such a lease then finds nothing to do, and needs
// no probe of each task to show that none runs. The rows are locked in
// lease order (a renewal locks them so too), so that two statements that
// change the same leases never deadlock; a row is found by a probe of its
// primary key whatever the statistics. A row from a node that predates the
// count has none and is left as it is: the release probes its tasks.
const leasesEnded = `ran AS MATERIALIZED (
    SELECT l.lease, l.task_count - e.n AS left
    FROM (SELECT lease, count(*) AS n FROM done GROUP BY lease) e, stint_lease l
    WHERE l.lease = ANY(ARRAY[e.lease]) AND l.task_count IS NOT NULL
    ORDER BY e.lease FOR NO KEY UPDATE OF l
), dropped AS (
    DELETE FROM stint_lease l USING ran r WHERE l.lease = ANY(ARRAY[r.lease]) AND r.left <= 0
), counted AS (
    UPDATE stint_lease l SET task_count = r.left FROM ran r WHERE l.lease = ANY(ARRAY[r.lease]) AND r.left > 0`

// childrenEndedSQL counts children that finished for good off their
// parents; the one that brings a waiting parent's count to zero makes it due
// and wakes the claimers. A held parent stays held and is due from then
// on once released. The parent row's lock serializes concurrent finishes of
// siblings, so exactly one of them wakes the parent; the parents are
// locked in id order, so that two batches ending children of the same
// parents never deadlock. A workflow's task,
// which waited in the status waiting, is recorded in the change feed as
// it becomes due. It returns the
// parents that are workflows grown at run time (see growWorkflow): read
// under the row's lock, so as of the parent's newest version.
var childrenEndedSQL = `
WITH locked AS MATERIALIZED (
    SELECT p.id FROM stint_task p WHERE p.id = ANY($1::text[]) ORDER BY p.id FOR UPDATE
), woken AS (
    UPDATE stint_task p SET
        children_pending = greatest(p.children_pending - e.n, 0),
        status = CASE WHEN p.status = 'waiting' AND p.waiting_children AND p.children_pending - e.n <= 0
            THEN 'scheduled' ELSE p.status END,
        schedule_not_before = CASE WHEN p.status <> 'held' AND p.waiting_children AND p.children_pending - e.n <= 0
            THEN now() ELSE p.schedule_not_before END,
        held_due = CASE WHEN p.status = 'held' AND p.waiting_children AND p.children_pending - e.n <= 0
            THEN now() ELSE p.held_due END,
        waiting_children = p.waiting_children AND p.children_pending - e.n > 0
    FROM (SELECT l.id AS parent, c.n FROM locked l
          JOIN (SELECT parent, count(*) AS n FROM unnest($1::text[]) AS parent GROUP BY parent) c ON c.parent = l.id) e
    WHERE p.id = ANY(ARRAY[e.parent])
    RETURNING p.id, p.behavior, p.priority, p.schedule_not_before, p.group_key, p.status, p.parent_id,
        p.status = 'scheduled' AND p.schedule_not_before = now() AS woke,
        p.behavior = '` + string(api.WorkflowBehavior) + `' AS workflow,
        p.behavior = '` + string(api.WorkflowBehavior) + `' AND p.params ? 'grown' AS grown
), due AS (` + dueInsert("(SELECT * FROM woken WHERE woke) w") + `
), feed AS (` + feedInsert("(SELECT * FROM woken WHERE woke AND workflow) w", "status", "false") + `
), woke AS (
    SELECT count(pg_notify('` + store.ChannelDue + `', '')) AS n FROM (SELECT 1 FROM woken WHERE woke LIMIT 1) w
)
SELECT ARRAY(SELECT id FROM woken WHERE grown) FROM woke`

// Finish records completions; see store.Store.
func (s *Store) Finish(ctx context.Context, cs []store.Completion) ([]bool, error) {
	ok, _, err := s.FinishStart(ctx, cs, store.LocalStart{})
	return ok, err
}

// FinishStart records completions and starts workflow nodes they make
// ready on start.Node; see store.Store. A batch is one statement (more in
// a transaction when children end), so one row that cannot be written
// would fail them all: on such an error the batch is split in halves,
// each retried on its own, until the row is alone; it is then reported
// as not held (its run halts and the task is taken over when its lease
// expires) and every other completion is recorded. A batch that fails on
// nothing costs nothing more.
func (s *Store) FinishStart(ctx context.Context, cs []store.Completion, start store.LocalStart) ([]bool, []store.Claimed, error) {
	ok := make([]bool, len(cs))
	st := newStarts(start)
	if err := s.finishWaitsApart(ctx, cs, ok, st); err != nil {
		// A part of a split batch may have committed and started
		// tasks before another failed: they run under their leases
		// all the same.
		return nil, st.started, fmt.Errorf("finish tasks: %w", err)
	}
	return ok, st.started, nil
}

// finishIsolating records cs, splitting the batch around rows that cannot
// be written. ok[i] is set for the completions cs[i] whose lease held;
// the tasks started on st's node are added to st.
func (s *Store) finishIsolating(ctx context.Context, cs []store.Completion, ok []bool, st *starts) error {
	err := s.finishBatch(ctx, cs, ok, st)
	if err == nil || !rowError(err) {
		return err
	}
	if len(cs) == 1 {
		ok[0] = false
		return nil
	}
	half := len(cs) / 2
	if err := s.finishIsolating(ctx, cs[:half], ok[:half], st); err != nil {
		return err
	}
	return s.finishIsolating(ctx, cs[half:], ok[half:], st)
}

// rowError reports whether err is one a row of a statement can cause (a
// broken constraint, bad data, an exception raised by a trigger), rather
// than one of the connection, the server or the privileges, which splitting
// the batch would only repeat.
func rowError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "P0":
		return true
	}
	return false
}

// finishFamily records the n completions of a batch in which some tasks
// have parents or sleep on a signal's topic (sleeping: see signalWakeSQL;
// args are finishSQL's) in one transaction that also counts
// the tasks that ended for good off their parents and wakes the workflow
// nodes' dependents (nodesEnded), in two round trips: BEGIN, the settings
// and the finish statement in the first, the rest and the COMMIT in the
// second, unless a completion failed (a failure may skip dependents,
// whose ends take more rounds). It holds the parents' rows locked for a
// round trip, where a transaction of a round trip per statement held them
// for three. It returns the completions not recorded and the workflow
// nodes it started on st's node.
func (s *Store) finishFamily(ctx context.Context, settings string, args []any, n int, failed bool, sleeping []string, st *starts) ([]int64, []store.Claimed, error) {
	var lost []int64
	var started []store.Claimed
	err := s.connTx(ctx, func(c *pgx.Conn) error {
		var parents, nodes []string
		var hasDependents []bool
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(settings)
		b.Queue(finishSQL, args...).QueryRow(func(r pgx.Row) error { return r.Scan(&lost, &parents, &nodes, &hasDependents) })
		if len(sleeping) > 0 {
			b.Queue(signalWakeSQL, textArray(sleeping))
		}
		if err := c.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if err := checkLost(lost, n); err != nil {
			return err
		}
		// The nodes with dependents, and the others, whose workflow may
		// have grown since the probe (see nodesEnded).
		var have, others []string
		for i, id := range nodes {
			if hasDependents[i] {
				have = append(have, id)
			} else {
				others = append(others, id)
			}
		}
		var err error
		if started, err = nodesEnded(ctx, c, parents, have, others, st, !failed); err == nil && failed {
			err = commitConn(ctx, c)
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return lost, started, nil
}

// connTx runs fn on a connection of the pool, in a transaction that fn
// opens and, unless it fails, commits, with BEGIN and COMMIT queued in
// the batches of its first and last statements rather than in round trips
// of their own. A transaction fn leaves failed is rolled back; a
// connection it cannot be rolled back on (a cancelled round trip) is left
// in the transaction, and the pool closes it when it is released.
func (s *Store) connTx(ctx context.Context, fn func(c *pgx.Conn) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if err := fn(conn.Conn()); err != nil {
		rollbackConn(ctx, conn.Conn())
		return err
	}
	return nil
}

// commitConn commits the transaction open on c.
func commitConn(ctx context.Context, c querier) error {
	return committed(c.Exec(ctx, "COMMIT"))
}

// execCommit reads the result of a COMMIT queued in a batch.
func execCommit(br pgx.BatchResults) error {
	return committed(br.Exec())
}

// committed returns the error of a COMMIT that returned tag and err: a
// COMMIT of a failed transaction rolls it back without an error.
func committed(tag pgconn.CommandTag, err error) error {
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	return err
}

// rollbackConn ends a failed transaction on c; a connection it cannot
// end it on is closed by the pool when released.
func rollbackConn(ctx context.Context, c *pgx.Conn) {
	if !c.IsClosed() {
		_, _ = c.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
}

// checkLost checks the ordinals of the completions of a batch of n that
// finishSQL did not record.
func checkLost(lost []int64, n int) error {
	for _, ord := range lost {
		if ord < 1 || ord > int64(n) {
			return fmt.Errorf("completion %d of %d not recorded", ord, n)
		}
	}
	return nil
}

// genericFinishMax is the most completions a finish records on generic
// plans (see finishBatch).
const genericFinishMax = 32

// finishBatch records cs in one statement, and the ends of their children
// in the same transaction. It sets ok[i] for the completions cs[i] whose
// lease held, and adds the workflow nodes it started on st's node to st
// once its transaction committed.
func (s *Store) finishBatch(ctx context.Context, cs []store.Completion, ok []bool, st *starts) error {
	n := len(cs)
	ids, statuses := make(textArray, n), make(textArray, n)
	leases := make(uuidArray, n)
	results, errs := make(nullTextArray, n), make(nullTextArray, n)
	again := make(intArray, n)
	waits, topics := make(boolArray, n), make(textArray, n)
	var consumedIDs textArray
	var consumed intArray
	var sleeping []string
	hasParent, failed := false, false
	for i, c := range cs {
		failed = failed || c.Status == api.StatusFailure
		ids[i], leases[i], statuses[i], waits[i] = string(c.ID), uuid(c.Lease), string(c.Status), c.WaitChildren
		hasParent = hasParent || c.HasParent
		if topics[i] = c.WaitSignal; c.WaitSignal != "" {
			sleeping = append(sleeping, string(c.ID))
		}
		for _, seq := range c.Consumed {
			consumedIDs, consumed = append(consumedIDs, string(c.ID)), append(consumed, seq)
		}
		results[i] = jsonText(c.Result)
		if c.Error != nil {
			b, err := json.Marshal(c.Error)
			if err != nil {
				return fmt.Errorf("task %s: encode error: %w", c.ID, err)
			}
			errs[i] = jsonText(b)
		}
		again[i] = -1
		if c.Again || c.WaitChildren {
			again[i] = max(c.Delay, 0).Microseconds()
		}
	}
	// A small batch runs on generic plans, whose planning its statements
	// would otherwise cost as much as their work (see genericSettingsSQL);
	// a large one is planned for its arrays, as before generic plans were
	// used here (with them, one measurement of a burn-down took a tenth
	// more PostgreSQL CPU per task).
	settings := seqscanOffSQL
	if n <= genericFinishMax {
		settings = genericSettingsSQL
	}
	args := []any{lead(ids, ids, leases, statuses, results, errs, again, waits, consumedIDs, consumed, topics),
		leases, statuses, results, errs, again, waits, consumedIDs, consumed, topics}
	// The completions not recorded; the others are set in ok only once
	// the transaction committed: a transaction that fails records none.
	var lost []int64
	var woken []store.Claimed
	var err error
	switch {
	case hasParent || len(sleeping) > 0:
		lost, woken, err = s.finishFamily(ctx, settings, args, n, failed, sleeping, st)
	case len(st.HandOver) > 0 && !st.handed:
		lost, err = s.finishHandOver(ctx, settings, args, n, st)
	default:
		// A batch without children is one statement.
		var parents, nodes []string
		var hasDependents []bool
		err = indexedRowWith(ctx, s.pool, settings, finishSQL, args...).Scan(&lost, &parents, &nodes, &hasDependents)
		if err == nil && len(parents) > 0 {
			err = fmt.Errorf("tasks with parents were finished outside a transaction: set Completion.HasParent")
		}
	}
	if err == nil {
		err = checkLost(lost, n)
	}
	if err != nil {
		return err
	}
	st.started = append(st.started, woken...)
	for i := range ok {
		ok[i] = true
	}
	for _, ord := range lost {
		ok[ord-1] = false
	}
	return nil
}

// checkpointSQL stores a run's progress and records a progress event in
// the change feed, carrying the progress, unless the task had one less than
// a second ago: a fast checkpointer costs the feed at most one row per task
// and second. The event is the first of a burst; a reader that wants the
// latest progress reads the task. With $4 it keeps the progress as the
// task's next step (see stepKept): the task row's step counts them, so that
// checkpoints that wait for each other's row lock number theirs in turn.
// The messages whose seq $5 holds, which the run received, are consumed.
var checkpointSQL = `
WITH u AS (
    UPDATE stint_task SET progress = $3::jsonb, updated_at = now(),
        progress_event_at = CASE WHEN progress_event_at > statement_timestamp() - interval '1 second'
            THEN progress_event_at ELSE statement_timestamp() END,
        step = CASE WHEN $4::boolean THEN coalesce(step, 0) + 1 ELSE step END
    WHERE id = $1 AND lease = $2 AND status = 'running'
    RETURNING id, behavior, parent_id, progress, progress_event_at = statement_timestamp() AS announce, step
), feed AS (
    INSERT INTO stint_change (task_ids, behaviors, statuses, parent_ids, finals, progresses)
    SELECT ARRAY[id], ARRAY[behavior], ARRAY['running'], ARRAY[parent_id], ARRAY[false], ARRAY[progress]
    FROM u WHERE announce
), kept AS (` + stepKept + `
), consuming AS MATERIALIZED (` + consumeSignals(`(SELECT $1::text AS id, unnest($5::bigint[]) AS seq) x`, `EXISTS (SELECT 1 FROM u)`) + `
)
SELECT count(*) FROM u`

// Checkpoint stores progress; see store.Store. It leaves the lease row
// alone: inside a caller's transaction a write to it would hold up the
// renewals of every run of the same claim until that transaction ends.
func (s *Store) Checkpoint(ctx context.Context, tx pgx.Tx, r store.LeaseRef, progress json.RawMessage, keep bool, consumed []int64) error {
	var q batcher = s.pool
	if tx != nil {
		q = tx
	}
	var n int
	if err := indexedRow(ctx, q, checkpointSQL, string(r.ID), uuid(r.Lease), string(progress), keep, intArray(consumed)).Scan(&n); err != nil {
		return fmt.Errorf("checkpoint task %s: %w", r.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("checkpoint task %s: %w", r.ID, api.ErrHalt)
	}
	return nil
}

// SetPriority changes a running task's priority; see store.Store. Like
// Checkpoint it leaves the lease row alone. The claim hints of a task are
// written when it becomes due, from its row, so the new priority orders
// its next claim.
func (s *Store) SetPriority(ctx context.Context, r store.LeaseRef, priority int) error {
	tag, err := indexed(ctx, s.pool, nil, `
		UPDATE stint_task SET priority = $3, updated_at = now()
		WHERE id = $1 AND lease = $2 AND status = 'running'`, string(r.ID), uuid(r.Lease), priority)
	if err != nil {
		return fmt.Errorf("set priority of task %s: %w", r.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("set priority of task %s: %w", r.ID, api.ErrHalt)
	}
	return nil
}

// Unclaim gives running tasks back, due at once, in their place in the
// queue or behind the tasks that wait; see store.Store. As in a takeover,
// the next run covers a resubmit that came during this one.
func (s *Store) Unclaim(ctx context.Context, refs []store.LeaseRef, behind bool) error {
	return s.unclaim(ctx, refs, behind, 0)
}

// Postpone gives running tasks back, due after delay; see store.Store.
func (s *Store) Postpone(ctx context.Context, refs []store.LeaseRef, delay time.Duration) error {
	return s.unclaim(ctx, refs, true, delay)
}

func (s *Store) unclaim(ctx context.Context, refs []store.LeaseRef, behind bool, delay time.Duration) error {
	ids, leases := leaseRefArrays(refs)
	_, err := indexed(ctx, s.pool, nil, unclaimSQL, ids, leases, behind, delay.Microseconds())
	if err != nil {
		return fmt.Errorf("unclaim tasks: %w", err)
	}
	return nil
}

// leaseRefArrays returns the task ids and leases of refs, in order, as
// statement parameters.
func leaseRefArrays(refs []store.LeaseRef) (textArray, uuidArray) {
	ids := make(textArray, len(refs))
	leases := make(uuidArray, len(refs))
	for i, r := range refs {
		ids[i], leases[i] = string(r.ID), uuid(r.Lease)
	}
	return ids, leases
}

// unclaimSQL gives the running tasks $1 back under their leases $2, due
// at once: at the time they were due when claimed (kept in
// schedule_not_before while they run), or now when $3 (behind), or $4
// microseconds from now when that is not zero.
var unclaimSQL = `
WITH u AS (
    UPDATE stint_task t SET status = 'scheduled',
        schedule_not_before = CASE WHEN $4::bigint > 0 THEN now() + $4 * interval '1 microsecond'
            WHEN $3::boolean THEN now() ELSE least(t.schedule_not_before, now()) END, lost_not_before = NULL,
        executed_at = NULL, attempt = t.attempt - 1, resubmit = t.resubmit OR t.resubmitted, resubmit_due = NULL,
        updated_at = now()
    FROM unnest($1::text[], $2::uuid[]) AS r(id, lease)
    WHERE t.id = ANY(ARRAY[r.id]) AND t.lease = r.lease AND t.status = 'running'
    RETURNING t.id, t.behavior, t.parent_id, t.priority, t.schedule_not_before, t.group_key, t.status
), due AS (` + dueInsert("u") + `)
` + feedInsert("u", "'scheduled'::text", "false")
