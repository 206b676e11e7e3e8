package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// submitSQL inserts tasks or merges them into existing ones, following
// couch_jobs' add: a scheduled task keeps its params and takes the new due
// time, a running task is flagged to run again when it ends (params kept,
// the new due time kept for then), a finished task is scheduled again with
// the new params, keeping the result or error of its last run until its
// next run ends (a client may not write them). A task that waits to run again after a run (a retry or a
// reschedule) is a scheduled task, not a finished one: it keeps its
// attempts, errors and last outcome, so resubmits cannot defeat the
// attempt limit; a retry keeps its backoff (the later of the two due
// times). A held task stays held. $11 replaces the params of a scheduled
// task (after a Combine). A task's retention is the one of the submit that
// created it.
var submitSQL = submitStatement(resubmitConflict, 12, false)

// resubmitConflict is the conflict clause of submitSQL.
var resubmitConflict = resubmitClause(`(t.status = 'scheduled' AND $11)`, `excluded.schedule_not_before`, "")

// resubmitClause returns the conflict clause of a resubmitting submit (see
// submitSQL): replace is the condition, besides a task finished for good,
// under which the submit's params (its rate uses and version with them)
// replace the task's; due is the due time the submit asks for, taken by a
// waiting task and kept for the run again of a running one; set, when not
// empty, assigns further columns (each line ending with a comma).
func resubmitClause(replace, due, set string) string {
	replaced := `CASE WHEN ` + finishedForGood + ` OR ` + replace + ` THEN excluded.`
	return `ON CONFLICT (id) DO UPDATE SET
    status = CASE WHEN ` + resubmitRefused + ` THEN ` + refuseSubmit + `
        WHEN ` + finishedForGood + ` THEN 'scheduled' ELSE t.status END,
    params = ` + replaced + `params ELSE t.params END,
    rate_uses = ` + replaced + `rate_uses ELSE t.rate_uses END,
    version = ` + replaced + `version ELSE t.version END,
    priority = CASE WHEN t.status = 'running' THEN t.priority ELSE excluded.priority END,
    schedule_not_before = CASE WHEN t.status IN ('running', 'held') THEN t.schedule_not_before
        WHEN t.status = 'failure' AND t.schedule_not_before IS NOT NULL THEN greatest(t.schedule_not_before, ` + due + `)
        ELSE ` + due + ` END,
    resubmit = t.resubmit OR t.status = 'running',
    resubmit_due = CASE WHEN t.status = 'running' THEN ` + due + ` ELSE t.resubmit_due END,
    awaited = t.awaited OR excluded.awaited,
    attempt = CASE WHEN ` + finishedForGood + ` THEN 0 ELSE t.attempt END,
    errors = CASE WHEN ` + finishedForGood + ` THEN 0 ELSE t.errors END,
    executed_at = CASE WHEN ` + finishedForGood + ` THEN NULL ELSE t.executed_at END,
    finished_at = CASE WHEN ` + finishedForGood + ` THEN NULL ELSE t.finished_at END,
` + set + `    updated_at = now()
RETURNING t.id, t.status, t.xmax = 0 AS created, t.behavior, t.parent_id, t.priority, t.schedule_not_before, t.group_key, t.lease`
}

// finishedForGood is the condition under which the existing task t of a
// submit finished for good: it has an outcome and waits for no next run.
const finishedForGood = `(t.status IN ('success', 'failure') AND t.schedule_not_before IS NULL)`

// shareSQL inserts tasks and leaves existing ones as they are.
var shareSQL = submitStatement(shareConflict, 11, false)

// shareConflict is the conflict clause of shareSQL. An existing task is
// left as it is (locked, not written) unless the submit is refused.
const shareConflict = `ON CONFLICT (id) DO UPDATE SET status = ` + refuseSubmit + ` WHERE ` + shareRefused + `
RETURNING t.id, t.status, true AS created, t.behavior, t.parent_id, t.priority, t.schedule_not_before, t.group_key, t.lease`

// submitStartSQL and shareStartSQL are submitSQL and shareSQL that start
// tasks on the submitting node (see store.Store.SubmitStart). Their
// parameters are those of the statements they extend, then the tasks'
// start leases in microseconds (0: do not start) and the node.
var (
	submitStartSQL = submitStatement(resubmitConflict, 12, true)
	shareStartSQL  = submitStatement(shareConflict, 11, true)
)

// newSQL and newStartSQL are shareSQL and shareStartSQL for tasks whose
// ids no stored task can have (store.NewTask.Unique): a plain insert. The
// conflict clause costs an index probe and a write-ahead log record per
// task, about a fifth of the insert. Should a new id be taken after all,
// the statement fails with a unique violation of the primary key and the
// submit runs again with the conflict clauses (see submitOn).
var (
	newSQL      = submitStatement(newConflict, 11, false)
	newStartSQL = submitStatement(newConflict, 11, true)
)

// newConflict ends the insert of newSQL: there is no conflict to resolve.
const newConflict = `RETURNING t.id, t.status, true AS created, t.behavior, t.parent_id, t.priority, t.schedule_not_before, t.group_key, t.lease`

// submitStatement returns a submit statement: the insert of the tasks
// $1..$10 with the conflict clause conflict, followed by
// recordSubmitChanges. wake is the number of the parameter that says
// whether to notify the claimers; a statement that starts tasks (start)
// takes the start leases and the node in the two parameters after it.
//
// A starting statement decides, as its insert reads each task, which
// tasks start (its join to cfg): those with a start lease, no delay, a
// behavior not paused nor capped at runtime (uncapped), a group key not
// held, and no due claim hint of their behavior at the same or a lower
// priority number in the claim index. The behaviors and keys of the tasks
// with a start lease (w, three arrays) find the pause and hold rows and
// the leases; the tasks' rows are made once, as the insert reads them,
// rather than kept in a CTE read again. It reads the pause and hold
// rows twice: in its snapshot, as a claim does, and as dueInsert does
// (share-locked, which sees a pause or hold committed since the snapshot,
// skipping those a resume, release or lease change holds). A row locked
// by a change is so still judged by the snapshot: a lease change of a
// paused behavior, or a release that rolls back, starts nothing. Each
// behavior's tasks get one fresh lease, as a claim's do, with an
// operator's lease setting
// taking precedence. The insert stores the tasks that start running under
// their lease (attempt 1, executed_at and lost_not_before as a claim
// sets them, due now); the conflict clause ignores those values for a
// task that exists, so only a created task starts. Its lease row is
// written for the created running tasks alone.
func submitStatement(conflict string, wake int, start bool) string {
	// The rate uses and the versions are the statement's last parameters.
	uses := wake + 1
	if start {
		uses = wake + 3
	}
	cols := insertArrays(uses)
	w := fmt.Sprintf("$%d", wake)
	if !start {
		return `
WITH s AS (
INSERT INTO stint_task AS t (` + insertColumns + `)
SELECT ` + insertValues + `
FROM ` + unnestRows("r", cols...) + `
` + conflict + `
)` + recordSubmitChanges(w, false)
	}
	startUS, node := fmt.Sprintf("$%d", wake+1), fmt.Sprintf("$%d", wake+2)
	return `
WITH w AS MATERIALIZED (
    SELECT * FROM ` + unnestRows("w", "behavior $2::text[]", "group_key $6::text[]", "start_us "+startUS+"::bigint[]") + `
    WHERE w.start_us > 0
), paused AS MATERIALIZED (
    SELECT pb.behavior FROM stint_behavior pb
    WHERE pb.paused AND pb.behavior IN (SELECT behavior FROM w) FOR SHARE SKIP LOCKED
), held AS MATERIALIZED (
    SELECT ph.group_key FROM stint_hold ph
    WHERE ph.group_key IN (SELECT group_key FROM w) FOR SHARE SKIP LOCKED
), cfg AS MATERIALIZED (
    SELECT w.behavior, coalesce(b.lease_ms * 1000, w.lease_us) AS lease_us, gen_random_uuid() AS lease
    FROM (SELECT behavior, max(start_us) AS lease_us FROM w GROUP BY behavior) w
    LEFT JOIN stint_behavior b ON b.behavior = w.behavior
    WHERE b.paused IS NOT TRUE AND ` + uncapped("w.behavior") + `
), s AS (
INSERT INTO stint_task AS t (` + insertColumns + `, status, lease, node, attempt, executed_at, lost_not_before)
SELECT ` + insertValues + `,
       CASE WHEN g.lease IS NULL THEN 'scheduled' ELSE 'running' END, g.lease,
       CASE WHEN g.lease IS NOT NULL THEN ` + node + ` END, CASE WHEN g.lease IS NULL THEN 0 ELSE 1 END,
       CASE WHEN g.lease IS NOT NULL THEN now() END, now() + g.lease_us * interval '1 microsecond'
FROM ` + unnestRows("r", append(cols, "start_us "+startUS+"::bigint[]")...) + `
LEFT JOIN cfg g ON g.behavior = r.behavior AND r.start_us > 0 AND r.delay_us = 0
    AND r.behavior NOT IN (SELECT behavior FROM paused)
    AND (r.group_key = '' OR (r.group_key NOT IN (SELECT group_key FROM held)
        AND NOT EXISTS (SELECT 1 FROM stint_hold h WHERE h.group_key = r.group_key)))
    AND NOT EXISTS (SELECT 1 FROM stint_due d
        WHERE NOT d.parked AND d.behavior = r.behavior AND d.priority <= r.priority AND d.due <= now())
` + conflict + `
), started AS MATERIALIZED (
    SELECT s.id, s.behavior, s.lease, g.lease_us FROM s JOIN cfg g ON g.lease = s.lease WHERE s.created AND s.status = 'running'
), leases AS (
    INSERT INTO stint_lease (lease, node, expires_at, task_ids, task_count, behavior)
    SELECT lease, ` + node + `, now() + max(lease_us) * interval '1 microsecond', array_agg(id), count(*), min(behavior) FROM started GROUP BY lease
)` + recordSubmitChanges(w, true)
}

// insertColumns are the columns of stint_task a submit statement inserts,
// insertValues their values from the row r of insertArrays.
const (
	insertColumns = `id, behavior, params, priority, schedule_not_before, group_key, parent_id, trace, awaited, retention_us, rate_uses,
    version`
	insertValues = `r.id, r.behavior, r.params::jsonb, r.priority, now() + r.delay_us * interval '1 microsecond',
       nullif(r.group_key, ''), nullif(r.parent_id, ''), nullif(r.trace, ''), r.awaited, nullif(r.retention_us, 0),
       nullif(r.rate_uses, '')::jsonb, nullif(r.version, 0)`
)

// insertArrays are the arrays a submit statement unnests into its rows
// (see unnestRows): submitColumns.args as $1 to $10, and the rate uses
// and versions as the parameters uses and uses+1.
func insertArrays(uses int) []string {
	return []string{"id $1::text[]", "behavior $2::text[]", "params $3::text[]", "priority $4::smallint[]", "delay_us $5::bigint[]",
		"group_key $6::text[]", "parent_id $7::text[]", "trace $8::text[]", "awaited $9::bool[]", "retention_us $10::bigint[]",
		fmt.Sprintf("rate_uses $%d::text[]", uses), fmt.Sprintf("version $%d::int[]", uses+1)}
}

// submitEvents are the change feed's events of a submit statement s: a
// created task's state, and the changed state of an existing one (not the
// resubmit flag of a running task: its state did not change).
const submitEvents = `s WHERE status <> 'running'`

// startEvents are submitEvents for a statement that may start tasks: a
// task created running (started on the submitting node) has two events,
// scheduled then running, so that every task's first event is its
// creation, as feed readers expect, wherever it runs. Only these
// statements pay for the second row per task.
//
// The second rows are a scan of their own (UNION ALL), not a join of every
// task to two candidate rows: that join cost a 5,000-task submit 3 ms.
// A started task's two events keep their order: the scheduled ones come
// first.
const startEvents = `(SELECT s.id, s.behavior, 'scheduled' AS status, s.parent_id FROM s WHERE s.created AND s.status = 'running'
    UNION ALL
    SELECT s.id, s.behavior, s.status, s.parent_id FROM s WHERE s.status <> 'running' OR s.created) events`

// recordSubmitChanges ends the submit statements: it adds the claim hints,
// records the new states in the change feed (see submitEvents and
// startEvents), notifies the claimers in the same transaction when the
// parameter wake says so, and returns the submissions; with started, also
// the lease and lease duration (in microseconds) of each task the
// statement started.
func recordSubmitChanges(wake string, started bool) string {
	events, end := submitEvents, `SELECT id, status, created FROM s LEFT JOIN wake ON true`
	if started {
		events = startEvents
		end = `SELECT s.id, s.status, s.created, g.lease, g.lease_us
FROM s LEFT JOIN cfg g ON s.created AND s.status = 'running' AND g.lease = s.lease LEFT JOIN wake ON true`
	}
	return `, due AS (` + dueInsert("s") + `
), feed AS (` + feedInsert(events, "status", "false") + `
), wake AS MATERIALIZED (
    SELECT pg_notify('` + store.ChannelDue + `', '') WHERE ` + wake + `::boolean
)
` + end
}

// Submit stores tasks; see store.Store.
func (s *Store) Submit(ctx context.Context, tasks []store.NewTask) ([]api.Submission, error) {
	out, _, err := submitOn(ctx, s.pool, tasks, "", true)
	return out, err
}

// SubmitStart stores tasks and starts some of them on node; see
// store.Store.
func (s *Store) SubmitStart(ctx context.Context, node string, tasks []store.NewTask) ([]api.Submission, []store.Claimed, error) {
	return submitOn(ctx, s.pool, tasks, node, true)
}

// SubmitTx stores tasks in the caller's transaction; see store.Store.
func (s *Store) SubmitTx(ctx context.Context, tx pgx.Tx, tasks []store.NewTask) ([]api.Submission, error) {
	out, _, err := submitOn(ctx, tx, tasks, "", false)
	return out, err
}

// submitOn stores tasks through db: the pool, or a caller's transaction,
// in which a nested transaction is a savepoint. With a node, it starts
// tasks there as SubmitStart does.
//
// With own (db is the pool: a failed statement aborts no transaction of
// the caller's), tasks with new ids are inserted without their conflict
// clause; should one of those ids be taken after all, the submit runs
// again with it.
func submitOn(ctx context.Context, db database, tasks []store.NewTask, node string, own bool) ([]api.Submission, []store.Claimed, error) {
	out, started, err := submitOnce(ctx, db, tasks, node, own)
	if own && newIDTaken(err) {
		out, started, err = submitOnce(ctx, db, tasks, node, false)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("submit: %w", submitRefused(err))
	}
	return out, started, nil
}

// newIDTaken reports whether err is a unique violation of a task's id.
func newIDTaken(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "stint_task_pkey"
}

// submitOnce is submitOn without the retry; newIDs is submit's.
func submitOnce(ctx context.Context, db database, tasks []store.NewTask, node string, newIDs bool) ([]api.Submission, []store.Claimed, error) {
	var out []api.Submission
	var started []store.Claimed
	var err error
	// Tasks of one dedup mode take one statement, atomic on its own: the
	// common case skips BEGIN and COMMIT. Mixed modes take two, in a
	// transaction. (A share statement may read existing rows after it,
	// which needs no atomicity.)
	mixed := false
	for _, t := range tasks {
		mixed = mixed || t.Share != tasks[0].Share
	}
	if mixed {
		err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			out, started, err = submit(ctx, tx, tasks, false, node, newIDs)
			return err
		})
	} else {
		out, started, err = submit(ctx, db, tasks, false, node, newIDs)
	}
	return out, started, err
}

// submit runs the insert statements for tasks on q: one for resubmitting
// tasks and one for sharing ones, whichever are needed. With a node, the
// tasks with a start lease may start there (see store.Store.SubmitStart);
// started lists them in the order of tasks. With newIDs, a statement whose
// tasks all have new ids (store.NewTask.Unique) is a plain insert (newSQL).
func submit(ctx context.Context, tx querier, tasks []store.NewTask, replaceParams bool, node string, newIDs bool) ([]api.Submission, []store.Claimed, error) {
	got := make(map[api.TaskID]api.Submission, len(tasks))
	for _, t := range tasks {
		got[t.ID] = api.Submission{ID: t.ID}
	}
	var leases map[api.TaskID]startLease
	var missing []string
	for _, share := range []bool{false, true} {
		n := 0
		for _, t := range tasks {
			if t.Share == share {
				n++
			}
		}
		if n == 0 {
			continue
		}
		cols := newSubmitColumns(n, node != "")
		for _, t := range tasks {
			if t.Share == share {
				cols.add(t, node != "")
			}
		}
		plain := newIDs && cols.unique == len(cols.ids)
		starting := cols.starts > 0
		var query string
		switch {
		case plain && starting:
			query = newStartSQL
		case plain:
			query = newSQL
		case share && starting:
			query = shareStartSQL
		case share:
			query = shareSQL
		case starting:
			query = submitStartSQL
		default:
			query = submitSQL
		}
		args := cols.args()
		if !share && !plain {
			args = append(args, replaceParams)
		}
		args = append(args, cols.wake)
		if starting {
			args = append(args, cols.startLeases, node)
		}
		args = append(args, cols.rateUses, cols.versions)
		var into map[api.TaskID]startLease
		if starting {
			if leases == nil {
				leases = map[api.TaskID]startLease{}
			}
			into = leases
		}
		settings := seqscanOffSQL
		if starting {
			settings = genericSettingsSQL
		}
		if _, err := indexedWith(ctx, tx, settings, func(rows pgx.Rows) error { return collectSubmissions(rows, got, into) }, query, args...); err != nil {
			return nil, nil, err
		}
		if share {
			for _, id := range cols.ids {
				if got[api.TaskID(id)].Status == "" {
					missing = append(missing, id)
				}
			}
		}
	}
	if len(missing) > 0 {
		if _, err := indexed(ctx, tx, func(rows pgx.Rows) error { return collectSubmissions(rows, got, nil) }, sharedSQL, missing); err != nil {
			return nil, nil, err
		}
	}
	out := make([]api.Submission, len(tasks))
	var started []store.Claimed
	for i, t := range tasks {
		sub := got[t.ID]
		if sub.Status == "" {
			return nil, nil, fmt.Errorf("task %s: no row after submit", t.ID)
		}
		out[i] = sub
		if l, ok := leases[t.ID]; ok {
			started = append(started, startedClaim(t, l))
		}
	}
	return out, started, nil
}

// sharedSQL reads the tasks $1 that a sharing submit left as they were.
const sharedSQL = `SELECT id, status, false FROM stint_task WHERE id = ANY($1)`

// combineLockSQL locks the task $1 for a combining submit and reads it:
// its status, its params, whether a submit of behavior $2 may combine
// with it (else the submit is refused: see resubmitRefused), and whether
// it has a due time.
const combineLockSQL = `SELECT status, params, behavior = $2 AND workflow_node IS NULL, schedule_not_before IS NOT NULL
FROM stint_task WHERE id = $1 FOR UPDATE`

// startLease is the lease a submit started a task under, and its duration
// in microseconds.
type startLease struct {
	lease [16]byte
	us    int64
}

// startedClaim returns the claim of the task t that its submit started
// under l: a first attempt, with no progress, as stored.
func startedClaim(t store.NewTask, l startLease) store.Claimed {
	params := t.Params
	if len(params) == 0 {
		params = json.RawMessage("{}")
	}
	return store.Claimed{
		LeaseRef:      store.LeaseRef{ID: t.ID, Lease: l.lease},
		LeaseDuration: time.Duration(l.us) * time.Microsecond,
		Behavior:      t.Behavior,
		Params:        params,
		Attempt:       1,
		Priority:      t.Priority,
		ParentID:      t.ParentID,
		GroupKey:      t.GroupKey,
		Trace:         t.Trace,
		Version:       t.Version,
	}
}

// submitColumns holds NewTasks as the column arrays submitSQL unnests.
type submitColumns struct {
	ids, behaviors, params, groupKeys, parentIDs, traces textArray
	priorities, delays, retentions                       intArray
	awaited                                              boolArray
	wake                                                 bool
	rateUses                                             textArray // each task's rate uses as JSON, "" for none
	versions                                             intArray  // each task's behavior version
	startLeases                                          intArray  // with a node: each task's start lease, 0 for none
	starts                                               int       // tasks with a start lease
	unique                                               int       // tasks with new ids (store.NewTask.Unique)
}

// newSubmitColumns returns columns with room for n tasks; with starting,
// also for their start leases.
func newSubmitColumns(n int, starting bool) submitColumns {
	c := submitColumns{ids: make(textArray, 0, n), behaviors: make(textArray, 0, n), params: make(textArray, 0, n),
		groupKeys: make(textArray, 0, n), parentIDs: make(textArray, 0, n), traces: make(textArray, 0, n),
		priorities: make(intArray, 0, n), delays: make(intArray, 0, n), retentions: make(intArray, 0, n),
		awaited: make(boolArray, 0, n), rateUses: make(textArray, 0, n), versions: make(intArray, 0, n)}
	if starting {
		c.startLeases = make(intArray, 0, n)
	}
	return c
}

// add appends t; with starting, also its start lease.
func (c *submitColumns) add(t store.NewTask, starting bool) {
	params := "{}" // also for none
	if len(t.Params) > 0 && string(t.Params) != "{}" {
		params = string(t.Params)
	}
	c.ids = append(c.ids, string(t.ID))
	c.behaviors = append(c.behaviors, string(t.Behavior))
	c.params = append(c.params, params)
	c.priorities = append(c.priorities, int64(t.Priority))
	c.delays = append(c.delays, t.Delay.Microseconds())
	c.groupKeys = append(c.groupKeys, t.GroupKey)
	c.parentIDs = append(c.parentIDs, string(t.ParentID))
	c.traces = append(c.traces, t.Trace)
	c.awaited = append(c.awaited, t.Notify)
	c.retentions = append(c.retentions, t.Retention.Microseconds())
	c.versions = append(c.versions, int64(t.Version))
	c.wake = c.wake || t.WakeClaimers
	if t.Unique {
		c.unique++
	}
	uses := ""
	if len(t.RateUses) > 0 {
		b, _ := json.Marshal(t.RateUses) // strings and numbers: cannot fail
		uses = string(b)
	}
	c.rateUses = append(c.rateUses, uses)
	if starting {
		c.startLeases = append(c.startLeases, t.StartLease.Microseconds())
		if t.StartLease > 0 {
			c.starts++
		}
	}
}

func (c *submitColumns) args() []any {
	return []any{c.ids, c.behaviors, c.params, c.priorities, c.delays, c.groupKeys, c.parentIDs, c.traces, c.awaited, c.retentions}
}

// SubmitCombined submits t, combining params with a scheduled task of the
// same id under a row lock; see store.Store.
func (s *Store) SubmitCombined(ctx context.Context, t store.NewTask, combine func(json.RawMessage) (json.RawMessage, error)) (api.Submission, error) {
	return submitCombinedOn(ctx, s.pool, t, combine)
}

// SubmitCombinedTx is SubmitCombined in the caller's transaction; see
// store.Store.
func (s *Store) SubmitCombinedTx(ctx context.Context, tx pgx.Tx, t store.NewTask, combine func(json.RawMessage) (json.RawMessage, error)) (api.Submission, error) {
	return submitCombinedOn(ctx, tx, t, combine)
}

// submitCombinedOn is SubmitCombined on db: the pool or a caller's
// transaction. A debounced task without combine takes one statement.
func submitCombinedOn(ctx context.Context, db database, t store.NewTask, combine func(json.RawMessage) (json.RawMessage, error)) (api.Submission, error) {
	var out []api.Submission
	var err error
	if t.Debounce != nil && combine == nil {
		out, err = debounce(ctx, db, t)
	} else {
		err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			var status string
			var persisted []byte
			var same, due bool
			err := indexedRow(ctx, tx, combineLockSQL, t.ID, string(t.Behavior)).Scan(&status, &persisted, &same, &due)
			replace := false
			switch {
			case isNoRows(err):
			case err != nil:
				return err
			case same && (status == string(api.StatusScheduled) || (t.Debounce != nil && combinesDebounced(status, due))):
				if t.Params, err = combine(persisted); err != nil {
					return err
				}
				replace = true
			}
			if t.Debounce != nil {
				out, err = debounce(ctx, tx, t)
			} else {
				out, _, err = submit(ctx, tx, []store.NewTask{t}, replace, "", false)
			}
			return err
		})
	}
	if err != nil {
		return api.Submission{}, fmt.Errorf("submit %s: %w", t.ID, submitRefused(err))
	}
	return out[0], nil
}

// collectSubmissions reads rows of (id, status, created) into got, which
// holds an entry for each task submitted, its Status empty until its row
// is read: a row's id and status take no allocation of their own. With
// leases, the rows are those of a starting submit statement, which adds
// lease and lease_us, and the lease of each task started goes to leases.
func collectSubmissions(rows pgx.Rows, got map[api.TaskID]api.Submission, leases map[api.TaskID]startLease) error {
	var id, status pgtype.DriverBytes
	var created bool
	var lease pgtype.UUID
	var leaseUS pgtype.Int8
	dest := []any{&id, &status, &created}
	if leases != nil {
		dest = append(dest, &lease, &leaseUS)
	}
	_, err := pgx.ForEachRow(rows, dest, func() error {
		sub, ok := got[api.TaskID(id)]
		if !ok {
			return fmt.Errorf("task %s: a row for a task not submitted", id)
		}
		sub.Status, sub.Created = internStatus(status), created
		got[sub.ID] = sub
		if lease.Valid {
			leases[sub.ID] = startLease{lease: lease.Bytes, us: leaseUS.Int64}
		}
		return nil
	})
	return err
}
