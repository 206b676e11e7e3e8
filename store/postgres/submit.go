package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
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
var submitSQL = `
WITH s AS (
INSERT INTO stint_task AS t (id, behavior, params, priority, schedule_not_before, group_key, parent_id, trace, awaited, retention_us)
SELECT r.id, r.behavior, r.params::jsonb, r.priority, now() + r.delay_us * interval '1 microsecond',
       nullif(r.group_key, ''), nullif(r.parent_id, ''), nullif(r.trace, ''), r.awaited, nullif(r.retention_us, 0)
FROM unnest($1::text[], $2::text[], $3::text[], $4::smallint[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::bool[], $10::bigint[])
     AS r(id, behavior, params, priority, delay_us, group_key, parent_id, trace, awaited, retention_us)
ON CONFLICT (id) DO UPDATE SET
    status = CASE WHEN ` + finishedForGood + ` THEN 'scheduled' ELSE t.status END,
    params = CASE WHEN ` + finishedForGood + ` OR (t.status = 'scheduled' AND $11) THEN excluded.params ELSE t.params END,
    priority = CASE WHEN t.status = 'running' THEN t.priority ELSE excluded.priority END,
    schedule_not_before = CASE WHEN t.status IN ('running', 'held') THEN t.schedule_not_before
        WHEN t.status = 'failure' AND t.schedule_not_before IS NOT NULL THEN greatest(t.schedule_not_before, excluded.schedule_not_before)
        ELSE excluded.schedule_not_before END,
    resubmit = t.resubmit OR t.status = 'running',
    resubmit_due = CASE WHEN t.status = 'running' THEN excluded.schedule_not_before ELSE t.resubmit_due END,
    awaited = t.awaited OR excluded.awaited,
    attempt = CASE WHEN ` + finishedForGood + ` THEN 0 ELSE t.attempt END,
    errors = CASE WHEN ` + finishedForGood + ` THEN 0 ELSE t.errors END,
    executed_at = CASE WHEN ` + finishedForGood + ` THEN NULL ELSE t.executed_at END,
    finished_at = CASE WHEN ` + finishedForGood + ` THEN NULL ELSE t.finished_at END,
    updated_at = now()
RETURNING t.id, t.status, t.xmax = 0 AS created, t.behavior, t.parent_id, t.priority, t.schedule_not_before, t.group_key
)` + recordSubmitChanges("$12")

// finishedForGood is the condition under which the existing task t of a
// submit finished for good: it has an outcome and waits for no next run.
const finishedForGood = `(t.status IN ('success', 'failure') AND t.schedule_not_before IS NULL)`

// shareSQL inserts tasks and leaves existing ones as they are.
var shareSQL = `
WITH s AS (
INSERT INTO stint_task AS t (id, behavior, params, priority, schedule_not_before, group_key, parent_id, trace, awaited, retention_us)
SELECT r.id, r.behavior, r.params::jsonb, r.priority, now() + r.delay_us * interval '1 microsecond',
       nullif(r.group_key, ''), nullif(r.parent_id, ''), nullif(r.trace, ''), r.awaited, nullif(r.retention_us, 0)
FROM unnest($1::text[], $2::text[], $3::text[], $4::smallint[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::bool[], $10::bigint[])
     AS r(id, behavior, params, priority, delay_us, group_key, parent_id, trace, awaited, retention_us)
ON CONFLICT (id) DO NOTHING
RETURNING t.id, t.status, true AS created, t.behavior, t.parent_id, t.priority, t.schedule_not_before, t.group_key
)` + recordSubmitChanges("$11")

// recordSubmitChanges ends the submit statements: it adds the claim hints,
// records the new states in the change feed (not the resubmit flag of a
// running task: its state did not change), notifies the claimers in the
// same transaction when the parameter wake says so, and returns the
// submissions.
func recordSubmitChanges(wake string) string {
	return `, due AS (` + dueInsert("s") + `
), feed AS (` + feedInsert("s WHERE status <> 'running'", "status", "false") + `
), wake AS MATERIALIZED (
    SELECT pg_notify('` + store.ChannelDue + `', '') WHERE ` + wake + `::boolean
)
SELECT id, status, created FROM s LEFT JOIN wake ON true`
}

// Submit stores tasks; see store.Store.
func (s *Store) Submit(ctx context.Context, tasks []store.NewTask) ([]api.Submission, error) {
	return submitOn(ctx, s.pool, tasks)
}

// SubmitTx stores tasks in the caller's transaction; see store.Store.
func (s *Store) SubmitTx(ctx context.Context, tx pgx.Tx, tasks []store.NewTask) ([]api.Submission, error) {
	return submitOn(ctx, tx, tasks)
}

// submitOn stores tasks through db: the pool, or a caller's transaction,
// in which a nested transaction is a savepoint.
func submitOn(ctx context.Context, db database, tasks []store.NewTask) ([]api.Submission, error) {
	var out []api.Submission
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
			out, err = submit(ctx, tx, tasks, false)
			return err
		})
	} else {
		out, err = submit(ctx, db, tasks, false)
	}
	if err != nil {
		return nil, fmt.Errorf("submit: %w", err)
	}
	return out, nil
}

// submit runs the insert statements for tasks on q: one for resubmitting
// tasks and one for sharing ones, whichever are needed.
func submit(ctx context.Context, tx querier, tasks []store.NewTask, replaceParams bool) ([]api.Submission, error) {
	got := make(map[api.TaskID]api.Submission, len(tasks))
	for _, t := range tasks {
		got[t.ID] = api.Submission{ID: t.ID}
	}
	var missing []string
	for _, share := range []bool{false, true} {
		var cols submitColumns
		for _, t := range tasks {
			if t.Share == share {
				cols.add(t)
			}
		}
		if len(cols.ids) == 0 {
			continue
		}
		query := submitSQL
		args := cols.args()
		if share {
			query = shareSQL
		} else {
			args = append(args, replaceParams)
		}
		args = append(args, cols.wake)
		rows, err := tx.Query(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		if err := collectSubmissions(rows, got); err != nil {
			return nil, err
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
		rows, err := tx.Query(ctx, `SELECT id, status, false FROM stint_task WHERE id = ANY($1)`, missing)
		if err != nil {
			return nil, err
		}
		if err := collectSubmissions(rows, got); err != nil {
			return nil, err
		}
	}
	out := make([]api.Submission, len(tasks))
	for i, t := range tasks {
		sub := got[t.ID]
		if sub.Status == "" {
			return nil, fmt.Errorf("task %s: no row after submit", t.ID)
		}
		out[i] = sub
	}
	return out, nil
}

// submitColumns holds NewTasks as the column arrays submitSQL unnests.
type submitColumns struct {
	ids, behaviors, params, groupKeys, parentIDs, traces textArray
	priorities, delays, retentions                       intArray
	awaited                                              boolArray
	wake                                                 bool
}

func (c *submitColumns) add(t store.NewTask) {
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
	c.wake = c.wake || t.WakeClaimers
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

func submitCombinedOn(ctx context.Context, db database, t store.NewTask, combine func(json.RawMessage) (json.RawMessage, error)) (api.Submission, error) {
	var out []api.Submission
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var status string
		var persisted []byte
		err := tx.QueryRow(ctx, `SELECT status, params FROM stint_task WHERE id = $1 FOR UPDATE`, t.ID).Scan(&status, &persisted)
		replace := false
		switch {
		case isNoRows(err):
		case err != nil:
			return err
		case status == string(api.StatusScheduled):
			if t.Params, err = combine(persisted); err != nil {
				return err
			}
			replace = true
		}
		out, err = submit(ctx, tx, []store.NewTask{t}, replace)
		return err
	})
	if err != nil {
		return api.Submission{}, fmt.Errorf("submit %s: %w", t.ID, err)
	}
	return out[0], nil
}

// collectSubmissions reads rows of (id, status, created) into got, which
// holds an entry for each task submitted, its Status empty until its row
// is read: a row's id and status take no allocation of their own.
func collectSubmissions(rows pgx.Rows, got map[api.TaskID]api.Submission) error {
	var id, status pgtype.DriverBytes
	var created bool
	_, err := pgx.ForEachRow(rows, []any{&id, &status, &created}, func() error {
		sub, ok := got[api.TaskID(id)]
		if !ok {
			return fmt.Errorf("task %s: a row for a task not submitted", id)
		}
		sub.Status, sub.Created = internStatus(status), created
		got[sub.ID] = sub
		return nil
	})
	return err
}
