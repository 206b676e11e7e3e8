package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// taskColumns is the column list scanned by scanTask.
var taskColumns = `id, behavior, status, priority, params, result, error, progress,
	` + leaseExpiry("schedule_not_before") + `, ` + leaseExpiry("lost_not_before") + `,
	lease, coalesce(node, ''), attempt, errors, resubmit,
	coalesce(parent_id, ''), coalesce(group_key, ''), coalesce(trace, ''),
	created_at, updated_at, executed_at, finished_at, awaited, children_pending`

// leaseExpiry returns column of stint_task, except for a running task: its
// lease row's expiry, which renewals move (the row keeps the expiry as of
// the claim).
func leaseExpiry(column string) string {
	return `CASE WHEN status = 'running'
	    THEN coalesce((SELECT l.expires_at FROM stint_lease l WHERE l.lease = stint_task.lease), ` + column + `)
	    ELSE ` + column + ` END`
}

func scanTask(row pgx.Row) (api.Task, error) {
	var (
		t         api.Task
		errJSON   []byte
		lease     *[16]byte
		params    []byte
		result    []byte
		progress  []byte
		status    string
		parentID  string
		behaviour string
		id        string
	)
	err := row.Scan(&id, &behaviour, &status, &t.Priority, &params, &result, &errJSON, &progress,
		&t.ScheduleNotBefore, &t.LostNotBefore, &lease, &t.Node, &t.Attempt, &t.Errors, &t.Resubmit,
		&parentID, &t.GroupKey, &t.Trace, &t.CreatedAt, &t.UpdatedAt, &t.ExecutedAt, &t.FinishedAt, &t.Notify, &t.ChildrenPending)
	if err != nil {
		if isNoRows(err) {
			return t, api.ErrNotFound
		}
		return t, err
	}
	t.ID, t.Behavior, t.Status, t.ParentID = api.TaskID(id), api.BehaviorID(behaviour), api.Status(status), api.TaskID(parentID)
	t.Params, t.Result, t.Progress = params, result, progress
	if lease != nil {
		t.Lease = formatUUID(*lease)
	}
	if errJSON != nil {
		t.Error = new(api.TaskError)
		if err := json.Unmarshal(errJSON, t.Error); err != nil {
			return t, fmt.Errorf("decode error of task %s: %w", id, err)
		}
	}
	return t, nil
}

func formatUUID(u [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// submitSQL inserts tasks or merges them into existing ones, following
// couch_jobs' add: a scheduled task keeps its params and takes the new due
// time, a running task is flagged to run again when it ends (params kept,
// the new due time kept for then), a finished task is scheduled again with
// the new params. A task that waits to run again after a run (a retry or a
// reschedule) is a scheduled task, not a finished one: it keeps its
// attempts, errors and last outcome, so resubmits cannot defeat the
// attempt limit; a retry keeps its backoff (the later of the two due
// times). A held task stays held. $10 replaces the params of a scheduled
// task (after a Combine).
var submitSQL = `
WITH s AS (
INSERT INTO stint_task AS t (id, behavior, params, priority, schedule_not_before, group_key, parent_id, trace, awaited)
SELECT r.id, r.behavior, r.params::jsonb, r.priority, now() + r.delay_us * interval '1 microsecond',
       nullif(r.group_key, ''), nullif(r.parent_id, ''), nullif(r.trace, ''), r.awaited
FROM unnest($1::text[], $2::text[], $3::text[], $4::smallint[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::bool[])
     AS r(id, behavior, params, priority, delay_us, group_key, parent_id, trace, awaited)
ON CONFLICT (id) DO UPDATE SET
    status = CASE WHEN ` + finishedForGood + ` THEN 'scheduled' ELSE t.status END,
    params = CASE WHEN ` + finishedForGood + ` OR (t.status = 'scheduled' AND $10) THEN excluded.params ELSE t.params END,
    priority = CASE WHEN t.status = 'running' THEN t.priority ELSE excluded.priority END,
    schedule_not_before = CASE WHEN t.status IN ('running', 'held') THEN t.schedule_not_before
        WHEN t.status = 'failure' AND t.schedule_not_before IS NOT NULL THEN greatest(t.schedule_not_before, excluded.schedule_not_before)
        ELSE excluded.schedule_not_before END,
    resubmit = t.resubmit OR t.status = 'running',
    resubmit_due = CASE WHEN t.status = 'running' THEN excluded.schedule_not_before ELSE t.resubmit_due END,
    awaited = t.awaited OR excluded.awaited,
    attempt = CASE WHEN ` + finishedForGood + ` THEN 0 ELSE t.attempt END,
    errors = CASE WHEN ` + finishedForGood + ` THEN 0 ELSE t.errors END,
    result = CASE WHEN ` + finishedForGood + ` THEN NULL ELSE t.result END,
    error = CASE WHEN ` + finishedForGood + ` THEN NULL ELSE t.error END,
    executed_at = CASE WHEN ` + finishedForGood + ` THEN NULL ELSE t.executed_at END,
    finished_at = CASE WHEN ` + finishedForGood + ` THEN NULL ELSE t.finished_at END,
    updated_at = now()
RETURNING t.id, t.status, t.xmax = 0 AS created, t.behavior, t.parent_id, t.priority, t.schedule_not_before, t.group_key
)` + recordSubmitChanges("$11")

// finishedForGood is the condition under which the existing task t of a
// submit finished for good: it has an outcome and waits for no next run.
const finishedForGood = `(t.status IN ('success', 'failure') AND t.schedule_not_before IS NULL)`

// shareSQL inserts tasks and leaves existing ones as they are.
var shareSQL = `
WITH s AS (
INSERT INTO stint_task AS t (id, behavior, params, priority, schedule_not_before, group_key, parent_id, trace, awaited)
SELECT r.id, r.behavior, r.params::jsonb, r.priority, now() + r.delay_us * interval '1 microsecond',
       nullif(r.group_key, ''), nullif(r.parent_id, ''), nullif(r.trace, ''), r.awaited
FROM unnest($1::text[], $2::text[], $3::text[], $4::smallint[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::bool[])
     AS r(id, behavior, params, priority, delay_us, group_key, parent_id, trace, awaited)
ON CONFLICT (id) DO NOTHING
RETURNING t.id, t.status, true AS created, t.behavior, t.parent_id, t.priority, t.schedule_not_before, t.group_key
)` + recordSubmitChanges("$10")

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
		var sub api.Submission
		if _, err := pgx.ForEachRow(rows, []any{&sub.ID, &sub.Status, &sub.Created}, func() error {
			got[sub.ID] = sub
			return nil
		}); err != nil {
			return nil, err
		}
		if share {
			for _, id := range cols.ids {
				if _, ok := got[api.TaskID(id)]; !ok {
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
		var sub api.Submission
		if _, err := pgx.ForEachRow(rows, []any{&sub.ID, &sub.Status, &sub.Created}, func() error {
			got[sub.ID] = sub
			return nil
		}); err != nil {
			return nil, err
		}
	}
	out := make([]api.Submission, len(tasks))
	for i, t := range tasks {
		sub, ok := got[t.ID]
		if !ok {
			return nil, fmt.Errorf("task %s: no row after submit", t.ID)
		}
		out[i] = sub
	}
	return out, nil
}

// submitColumns holds NewTasks as the column arrays submitSQL unnests.
type submitColumns struct {
	ids, behaviors, params, groupKeys, parentIDs, traces []string
	priorities                                           []int16
	delays                                               []int64
	awaited                                              []bool
	wake                                                 bool
}

func (c *submitColumns) add(t store.NewTask) {
	params := string(t.Params)
	if params == "" {
		params = "{}"
	}
	c.ids = append(c.ids, string(t.ID))
	c.behaviors = append(c.behaviors, string(t.Behavior))
	c.params = append(c.params, params)
	c.priorities = append(c.priorities, int16(t.Priority))
	c.delays = append(c.delays, t.Delay.Microseconds())
	c.groupKeys = append(c.groupKeys, t.GroupKey)
	c.parentIDs = append(c.parentIDs, string(t.ParentID))
	c.traces = append(c.traces, t.Trace)
	c.awaited = append(c.awaited, t.Notify)
	c.wake = c.wake || t.WakeClaimers
}

func (c *submitColumns) args() []any {
	return []any{c.ids, c.behaviors, c.params, c.priorities, c.delays, c.groupKeys, c.parentIDs, c.traces, c.awaited}
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

// Get returns a task.
func (s *Store) Get(ctx context.Context, id api.TaskID) (api.Task, error) {
	t, err := scanTask(s.pool.QueryRow(ctx, `SELECT `+taskColumns+` FROM stint_task WHERE id = $1`, id))
	if err != nil && err != api.ErrNotFound {
		return t, fmt.Errorf("get task %s: %w", id, err)
	}
	return t, err
}

// MarkAwaited sets the awaited flag and returns the task as of that write.
func (s *Store) MarkAwaited(ctx context.Context, id api.TaskID) (api.Task, error) {
	t, err := scanTask(s.pool.QueryRow(ctx,
		`UPDATE stint_task SET awaited = true WHERE id = $1 RETURNING `+taskColumns, id))
	if err != nil && err != api.ErrNotFound {
		return t, fmt.Errorf("mark task %s awaited: %w", id, err)
	}
	return t, err
}

// List returns a page of tasks in id order.
func (s *Store) List(ctx context.Context, f api.Filter) (api.Page, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	rows, err := s.pool.Query(ctx, `SELECT `+taskColumns+` FROM stint_task
		WHERE ($1 = '' OR behavior = $1) AND ($2 = '' OR status = $2)
		  AND ($3 = '' OR parent_id = $3) AND ($4 = '' OR group_key = $4) AND id > $5
		ORDER BY id LIMIT $6`,
		string(f.Behavior), string(f.Status), string(f.ParentID), f.GroupKey, string(f.After), limit+1)
	if err != nil {
		return api.Page{}, fmt.Errorf("list tasks: %w", err)
	}
	defer rows.Close()
	page := api.Page{Tasks: []api.Task{}}
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			return api.Page{}, fmt.Errorf("list tasks: %w", err)
		}
		page.Tasks = append(page.Tasks, t)
	}
	if err := rows.Err(); err != nil {
		return api.Page{}, fmt.Errorf("list tasks: %w", err)
	}
	if len(page.Tasks) > limit {
		page.Tasks = page.Tasks[:limit]
		page.Next = page.Tasks[limit-1].ID
	}
	return page, nil
}

// claimSQL takes up to $4 due tasks of the behaviors $2 in pickup order and
// issues each a lease: $3 for its behavior unless an operator set one in
// stint_behavior. It takes the first claim hints in stint_due, deletes
// them, and claims each hint's task if the hint still matches it (a hint
// made stale by a later change is dropped where it is found). Paused
// behaviors and held group keys are skipped. $5 is the look-ahead
// (couch_jobs' max_sched_time): tasks due that soon are taken early.
var claimSQL = claimCTEs(`
    DELETE FROM stint_due d WHERE d.ctid = ANY(ARRAY(
        SELECT c.ctid FROM stint_due c
        WHERE c.due <= now() + $5 * interval '1 microsecond'
          AND c.behavior = ANY(ARRAY(SELECT behavior FROM cfg))
          AND (c.group_key IS NULL OR NOT EXISTS (SELECT 1 FROM stint_hold h WHERE h.group_key = c.group_key))
        ORDER BY c.priority, c.due
        LIMIT $4
        FOR UPDATE SKIP LOCKED))
    RETURNING d.id, d.priority, d.due`)

// claimHintsSQL claims the tasks of the hints $4 (their ctids), already
// locked by the caller's transaction ($5 is unused, to keep the parameters
// of claimSQL).
var claimHintsSQL = claimCTEs(`
    DELETE FROM stint_due d WHERE d.ctid = ANY($4::tid[]) AND $5::bigint IS NOT NULL
    RETURNING d.id, d.priority, d.due`)

// claimCTEs returns a claim statement that takes the hints deleted by
// hints (a DELETE FROM stint_due returning id, priority and due). cfg holds
// the settings of the behaviors $2 (lease $3 unless an operator set one;
// paused ones left out) and a fresh lease token for each: all tasks of a
// behavior that one statement claims share a lease row in stint_lease, the
// fencing token of each run. A running task keeps the due time it was
// claimed at in schedule_not_before, for a takeover to put it back in its
// place. The claim updates only columns no index of stint_task covers, so it
// is a HOT update. It records the running state in the change feed and
// returns the claimed tasks.
func claimCTEs(hints string) string {
	return `
WITH cfg AS MATERIALIZED (
    SELECT w.behavior, coalesce(b.lease_ms * 1000, w.lease_us) AS lease_us, gen_random_uuid() AS lease
    FROM unnest($2::text[], $3::bigint[]) AS w(behavior, lease_us)
    LEFT JOIN stint_behavior b ON b.behavior = w.behavior
    WHERE b.paused IS NOT TRUE
), hint AS (` + hints + `
), claimed AS (
    UPDATE stint_task t SET
        status = 'running',
        lease = cfg.lease,
        node = $1,
        attempt = t.attempt + 1,
        executed_at = now(),
        lost_not_before = now() + cfg.lease_us * interval '1 microsecond',
        waiting_children = false,
        resubmitted = t.resubmit,
        resubmit = false,
        updated_at = now()
    FROM hint h, cfg
    WHERE ` + hintMatches("t", "h") + ` AND t.behavior = cfg.behavior
    RETURNING t.id, t.lease, t.behavior, t.params, t.progress, t.attempt, t.errors, t.priority,
        t.parent_id, t.group_key, t.trace, cfg.lease_us, t.resubmitted
), leases AS (
    INSERT INTO stint_lease (lease, node, expires_at, task_ids)
    SELECT lease, $1, now() + max(lease_us) * interval '1 microsecond', array_agg(id) FROM claimed GROUP BY lease
), feed AS (` + feedInsert("claimed", "'running'::text", "false") + `)
SELECT id, lease, behavior, params, progress, attempt, errors, priority,
    coalesce(parent_id, ''), coalesce(group_key, ''), coalesce(trace, ''), lease_us, resubmitted
FROM claimed`
}

// perGroupCandidatesSQL locks the first claim hints of one behavior for a
// claim with a cap per group key, leaving out the keys $4 (found at their
// cap) and the hints $5 (seen already); the caller picks among them. live
// tells whether the hint still stands for its task.
var perGroupCandidatesSQL = `
SELECT c.ctid, c.id, coalesce(c.group_key, ''),
    EXISTS (SELECT 1 FROM stint_task t WHERE ` + hintMatches("t", "c") + `) AS live
FROM stint_due c
WHERE c.behavior = $1
  AND c.due <= now() + $2 * interval '1 microsecond'
  AND NOT EXISTS (SELECT 1 FROM stint_behavior b WHERE b.behavior = $1 AND b.paused)
  AND (c.group_key IS NULL OR (c.group_key <> ALL($4::text[])
       AND NOT EXISTS (SELECT 1 FROM stint_hold h WHERE h.group_key = c.group_key)))
  AND c.ctid <> ALL($5::tid[])
ORDER BY c.priority, c.due
LIMIT $3
FOR UPDATE SKIP LOCKED`

// Claim takes due tasks; see store.Store.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) ([]store.Claimed, error) {
	behaviors := make([]string, len(req.Behaviors))
	leases := make([]int64, len(req.Behaviors))
	for i, b := range req.Behaviors {
		behaviors[i], leases[i] = string(b.Behavior), b.Lease.Microseconds()
	}
	if req.PerGroup > 0 {
		return s.claimPerGroup(ctx, req, behaviors, leases)
	}
	rows, err := s.pool.Query(ctx, claimSQL, req.Node, behaviors, leases, req.Limit, req.LookAhead.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("claim tasks: %w", err)
	}
	return scanClaimed(rows, req.Limit)
}

// claimPerGroup claims tasks of one behavior, at most req.PerGroup running
// per group key across all nodes. A transaction-scoped advisory lock per
// key serializes the claimers of a key, so that each counts the running
// tasks after the previous claimer committed.
//
// It reads the hints in pickup order a window at a time. A key found at its
// cap is left out of the scans that follow, so a group with a long backlog
// at its cap never hides the groups behind it; the hints it passed that no
// longer stand for their task are dropped. The first window's keys are
// locked in key order, waiting for other claimers; keys found later are
// only tried (a key another claimer holds counts as capped for this claim),
// so that two claimers never wait on each other.
func (s *Store) claimPerGroup(ctx context.Context, req store.ClaimRequest, behaviors []string, leases []int64) ([]store.Claimed, error) {
	if len(behaviors) != 1 {
		return nil, fmt.Errorf("claim tasks: a claim capped per group must name one behavior, not %d", len(behaviors))
	}
	var out []store.Claimed
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		g := groupClaim{tx: tx, behavior: behaviors[0], cap: req.PerGroup,
			running: map[string]int{}, taken: map[string]bool{}}
		window := req.Limit * 4
		for round := 0; round < maxGroupRounds && len(g.hints) < req.Limit; round++ {
			n, err := g.scan(ctx, req, window, round == 0)
			if err != nil {
				return err
			}
			if n < window {
				break
			}
		}
		if len(g.stale) > 0 {
			if _, err := tx.Exec(ctx, `DELETE FROM stint_due WHERE ctid = ANY($1)`, g.stale); err != nil {
				return err
			}
		}
		if len(g.hints) == 0 {
			return nil
		}
		rows, err := tx.Query(ctx, claimHintsSQL, req.Node, behaviors, leases, g.hints, int64(0))
		if err != nil {
			return err
		}
		out, err = scanClaimed(rows, len(g.hints))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim tasks: %w", err)
	}
	return out, nil
}

// maxGroupRounds bounds the windows of hints one capped claim reads: each
// round leaves out the keys the ones before found at their cap.
const maxGroupRounds = 8

// groupClaim is the state of a claim capped per group key.
type groupClaim struct {
	tx       pgx.Tx
	behavior string
	cap      int
	running  map[string]int  // running tasks of the locked keys, picks included
	capped   []string        // keys at their cap, or locked by another claimer
	seen     []pgtype.TID    // hints read so far
	hints    []pgtype.TID    // hints picked to claim
	stale    []pgtype.TID    // hints that no longer stand for their task
	taken    map[string]bool // picked task ids: a task may have several hints
}

// scan reads the next window of hints, locks and counts their new keys
// (waiting for the lock when wait is set) and picks hints up to the limit.
// It returns how many hints it read.
func (g *groupClaim) scan(ctx context.Context, req store.ClaimRequest, window int, wait bool) (int, error) {
	type candidate struct {
		hint    pgtype.TID
		id, key string
		live    bool
	}
	capped, seen := g.capped, g.seen
	if capped == nil {
		capped = []string{}
	}
	if seen == nil {
		seen = []pgtype.TID{}
	}
	rows, err := g.tx.Query(ctx, perGroupCandidatesSQL, g.behavior, req.LookAhead.Microseconds(), window, capped, seen)
	if err != nil {
		return 0, err
	}
	var cands []candidate
	var c candidate
	if _, err := pgx.ForEachRow(rows, []any{&c.hint, &c.id, &c.key, &c.live}, func() error { cands = append(cands, c); return nil }); err != nil {
		return 0, err
	}
	var keys []string
	for _, c := range cands {
		g.seen = append(g.seen, c.hint)
		if !c.live {
			g.stale = append(g.stale, c.hint)
			continue
		}
		if _, counted := g.running[c.key]; c.key != "" && !counted && !slices.Contains(keys, c.key) && !slices.Contains(g.capped, c.key) {
			keys = append(keys, c.key)
		}
	}
	if err := g.lockAndCount(ctx, keys, wait); err != nil {
		return 0, err
	}
	for _, c := range cands {
		if len(g.hints) == req.Limit {
			break
		}
		if !c.live || g.taken[c.id] {
			continue
		}
		if c.key != "" {
			n, counted := g.running[c.key]
			if !counted || n >= g.cap {
				if !slices.Contains(g.capped, c.key) {
					g.capped = append(g.capped, c.key)
				}
				continue
			}
			g.running[c.key]++
		}
		g.taken[c.id] = true
		g.hints = append(g.hints, c.hint)
	}
	return len(cands), nil
}

// lockAndCount takes the advisory locks of keys in key order, waiting when
// wait is set and else only trying (a key it cannot lock stays uncounted,
// and so capped), and counts the running tasks of the keys it locked.
func (g *groupClaim) lockAndCount(ctx context.Context, keys []string, wait bool) error {
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	lock := `SELECT k FROM unnest($1::text[]) AS k WHERE pg_try_advisory_xact_lock(hashtextextended('stint.group:' || k, 0)) ORDER BY k`
	if wait {
		lock = `SELECT k FROM unnest($1::text[]) AS k, pg_advisory_xact_lock(hashtextextended('stint.group:' || k, 0)) ORDER BY k`
	}
	rows, err := g.tx.Query(ctx, lock, keys)
	if err != nil {
		return err
	}
	locked, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(locked) == 0 {
		return err
	}
	for _, k := range locked {
		g.running[k] = 0
	}
	rows, err = g.tx.Query(ctx, `SELECT group_key, count(*) FROM stint_task
		WHERE behavior = $1 AND group_key = ANY($2) AND status = 'running'
		GROUP BY group_key`, g.behavior, locked)
	if err != nil {
		return err
	}
	var k string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&k, &n}, func() error { g.running[k] = n; return nil })
	return err
}

// uuid wraps a lease for pgx. A pgtype.UUID names its type, which the exec
// and simple query modes (used behind PgBouncer) need; a bare [16]byte
// does not.
func uuid(b [16]byte) pgtype.UUID { return pgtype.UUID{Bytes: b, Valid: true} }

// feedInsert returns the statement that records the tasks of from (a CTE
// with id, behavior and parent_id, and a filter) in the change feed as one
// row, with the status and final expressions given. Its arguments are
// constants of this package, never input.
func feedInsert(from, status, final string) string {
	return `
    INSERT INTO stint_change (task_ids, behaviors, statuses, parent_ids, finals)
    SELECT array_agg(id), array_agg(behavior), array_agg(` + status + `), array_agg(parent_id), array_agg(` + final + `)
    FROM ` + from + `
    HAVING count(*) > 0`
}

// dueInsert returns the statement that adds claim hints for the rows of
// from (a CTE with id, behavior, priority, schedule_not_before, group_key
// and status) that wait to run. Its argument is a constant of this package.
func dueInsert(from string) string {
	return `
    INSERT INTO stint_due (id, behavior, priority, due, group_key)
    SELECT id, behavior, priority, schedule_not_before, group_key FROM ` + from + `
    WHERE schedule_not_before IS NOT NULL AND status IN ` + waitingStatuses
}

// waitingStatuses are the statuses of a task that waits to run when it has
// a due time: scheduled, or finished and due again (a recurring task).
const waitingStatuses = `('scheduled', 'success', 'failure')`

// hintMatches returns the condition under which the hint d (a row of
// stint_due) still stands for the task t: the task waits to run at the
// hint's due time and priority. Claims take only such hints; counts of the
// backlog count only them.
func hintMatches(t, d string) string {
	return t + `.id = ` + d + `.id AND ` + t + `.status IN ` + waitingStatuses + `
      AND ` + t + `.schedule_not_before = ` + d + `.due AND ` + t + `.priority = ` + d + `.priority`
}

// scanClaimed reads the rows of a claim statement.
func scanClaimed(rows pgx.Rows, capacity int) ([]store.Claimed, error) {
	out := make([]store.Claimed, 0, capacity)
	var c store.Claimed
	var params, progress []byte
	var leaseUS int64
	_, err := pgx.ForEachRow(rows, []any{&c.ID, &c.Lease, &c.Behavior, &params, &progress, &c.Attempt, &c.Errors,
		&c.Priority, &c.ParentID, &c.GroupKey, &c.Trace, &leaseUS, &c.Resubmitted}, func() error {
		c.LeaseDuration = time.Duration(leaseUS) * time.Microsecond
		// pgx scans jsonb into a fresh slice for each row.
		c.Params, c.Progress = params, progress
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read claimed tasks: %w", err)
	}
	return out, nil
}

// Renew extends leases; see store.Store. Runs share the lease row of
// their claim: the statement renews each lease row once, and reports a run
// as held only if its task still runs under that lease.
func (s *Store) Renew(ctx context.Context, rs []store.Renewal) (map[api.TaskID]bool, error) {
	ids := make([]string, len(rs))
	leases := make([]pgtype.UUID, len(rs))
	durs := make([]int64, len(rs))
	for i, r := range rs {
		ids[i], leases[i], durs[i] = string(r.ID), uuid(r.Lease), r.Duration.Microseconds()
	}
	rows, err := s.pool.Query(ctx, `
		WITH r AS (
		    SELECT lease, max(us) AS us FROM unnest($2::uuid[], $3::bigint[]) AS r(lease, us) GROUP BY lease
		), renewed AS (
		    UPDATE stint_lease l SET expires_at = now() + r.us * interval '1 microsecond'
		    FROM r WHERE l.lease = r.lease
		    RETURNING l.lease
		)
		SELECT t.id FROM stint_task t
		JOIN unnest($1::text[], $2::uuid[]) AS x(id, lease) ON t.id = x.id AND t.lease = x.lease
		WHERE t.status = 'running' AND x.lease IN (SELECT lease FROM renewed)`, ids, leases, durs)
	if err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	held := make(map[api.TaskID]bool, len(rs))
	var id string
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { held[api.TaskID(id)] = true; return nil }); err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	return held, nil
}

// ReleaseLeases deletes lease rows none of whose runs is left; see
// store.Store.
func (s *Store) ReleaseLeases(ctx context.Context, leases [][16]byte) error {
	ls := make([]pgtype.UUID, len(leases))
	for i, l := range leases {
		ls[i] = uuid(l)
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM stint_lease WHERE lease = ANY($1)`, ls); err != nil {
		return fmt.Errorf("release leases: %w", err)
	}
	return nil
}

// takeoverSQL takes over up to $1 expired leases: it makes their tasks that
// still run under them due again (their node died, stalled or was cut off
// for longer than the lease) and deletes the leases. It never waits for a
// lock: it skips leases another takeover holds, and tasks whose row another
// transaction locked (a stalled node inside its own transaction after
// CheckpointTx); a lease with such a task is kept, so that a later takeover
// finds that task once the lock is gone. A lost task is due at the time it
// was due when claimed, so that it goes back to its place in the queue
// rather than behind every task that became due while it ran. The lost run
// counts as an attempt (the next claim increments it), as a lost Polaris
// task does. A submit that came during the lost run asks for no run of its
// own: the re-run covers it, and is reported as a resubmitted run.
var takeoverSQL = `
WITH expired AS MATERIALIZED (
    SELECT lease, task_ids FROM stint_lease WHERE expires_at <= now()
    ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
), owned AS MATERIALIZED (
    SELECT t.id, e.lease FROM expired e CROSS JOIN unnest(e.task_ids) AS u(id)
    JOIN stint_task t ON t.id = u.id AND t.lease = e.lease AND t.status = 'running'
), free AS MATERIALIZED (
    SELECT t.id, t.lease FROM stint_task t
    WHERE t.id IN (SELECT id FROM owned) AND t.status = 'running' AND t.lease IN (SELECT lease FROM expired)
    FOR UPDATE SKIP LOCKED
), dropped AS (
    DELETE FROM stint_lease l USING expired e
    WHERE l.lease = e.lease AND NOT EXISTS (
        SELECT 1 FROM owned o WHERE o.lease = e.lease AND NOT EXISTS (SELECT 1 FROM free f WHERE f.id = o.id AND f.lease = o.lease))
    RETURNING l.lease
), lost AS (
    UPDATE stint_task t SET status = 'scheduled', schedule_not_before = least(t.schedule_not_before, now()), lost_not_before = NULL,
        executed_at = NULL, resubmit = t.resubmit OR t.resubmitted, resubmit_due = NULL, updated_at = now()
    FROM free f
    WHERE t.id = f.id AND t.lease = f.lease AND t.status = 'running'
    RETURNING t.id, t.behavior, t.priority, t.schedule_not_before, t.group_key, t.status, t.parent_id
), due AS (` + dueInsert("lost") + `
), feed AS (` + feedInsert("lost", "'scheduled'::text", "false") + `
), wake AS MATERIALIZED (
    SELECT pg_notify('` + store.ChannelDue + `', '') FROM (SELECT 1 FROM lost LIMIT 1) l
)
SELECT (SELECT count(*) FROM dropped), (SELECT count(*) FROM lost) FROM (SELECT count(*) FROM wake) w`

// Takeover makes the tasks of expired leases due again; see store.Store.
func (s *Store) Takeover(ctx context.Context, limit int) (leases, tasks int, err error) {
	if err := s.pool.QueryRow(ctx, takeoverSQL, limit).Scan(&leases, &tasks); err != nil {
		return 0, 0, fmt.Errorf("take over expired leases: %w", err)
	}
	return leases, tasks, nil
}

// finishSQL records a batch of completions, each fenced by its lease. A task
// flagged for resubmit is scheduled again at the due time that submit asked
// for (at once if it passed), flagged so that its next claim reports a
// resubmitted run; a snooze ($3 =
// 'scheduled') does not count as an attempt; a parent waiting for children
// ($7) is due at once if none is pending, else after the fallback delay.
// Awaited tasks are notified in the same transaction, so a woken awaiter
// sees the result; ids go in chunks of 50 to stay under the 8,000-byte
// payload limit.
var finishSQL = `
WITH c AS (
    SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bool[])
        AS c(id, lease, status, result, error, again_us, wait_children)
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
            WHEN c.again_us >= 0 THEN now() + c.again_us * interval '1 microsecond' END,
        waiting_children = c.wait_children AND t.children_pending > 0,
        lost_not_before = NULL,
        executed_at = CASE WHEN t.resubmit OR c.status = 'scheduled' THEN NULL ELSE t.executed_at END,
        finished_at = CASE WHEN c.status = 'scheduled' THEN t.finished_at ELSE now() END,
        resubmit = t.resubmit,
        resubmit_due = NULL,
        updated_at = now()
    FROM c
    WHERE t.id = c.id AND t.lease = c.lease AND t.status = 'running'
    RETURNING t.id, t.behavior, t.status, t.parent_id, t.awaited, t.priority, t.schedule_not_before, t.group_key,
        t.status IN ('success', 'failure') AND t.schedule_not_before IS NULL AS final
), due AS (` + dueInsert("done") + `
), feed AS (` + feedInsert("done", "status", "final") + `), notified AS (
    SELECT count(pg_notify('` + store.ChannelFinished + `', ids)) AS n FROM (
        SELECT string_agg(id, ',') AS ids FROM (
            SELECT id, (row_number() OVER ()) / 50 AS chunk FROM done WHERE awaited) a
        GROUP BY chunk) b
)
SELECT done.id, coalesce(done.parent_id, ''), done.final FROM done, notified`

// childrenEndedSQL counts children that finished for good off their
// parents; the one that brings a waiting parent's count to zero makes it due
// and wakes the claimers. A held parent stays held and is due from then
// on once released. The parent row's lock serializes concurrent finishes of
// siblings, so exactly one of them wakes the parent.
var childrenEndedSQL = `
WITH woken AS (
    UPDATE stint_task p SET
        children_pending = greatest(p.children_pending - e.n, 0),
        schedule_not_before = CASE WHEN p.status <> 'held' AND p.waiting_children AND p.children_pending - e.n <= 0
            THEN now() ELSE p.schedule_not_before END,
        held_due = CASE WHEN p.status = 'held' AND p.waiting_children AND p.children_pending - e.n <= 0
            THEN now() ELSE p.held_due END,
        waiting_children = p.waiting_children AND p.children_pending - e.n > 0
    FROM (SELECT parent, count(*) AS n FROM unnest($1::text[]) AS parent GROUP BY parent) e
    WHERE p.id = e.parent
    RETURNING p.id, p.behavior, p.priority, p.schedule_not_before, p.group_key, p.status,
        p.status = 'scheduled' AND p.schedule_not_before = now() AS woke
), due AS (` + dueInsert("(SELECT * FROM woken WHERE woke) w") + `
)
SELECT pg_notify('` + store.ChannelDue + `', '') FROM (SELECT 1 FROM woken WHERE woke LIMIT 1) w`

// Finish records completions; see store.Store. A batch is one statement
// (two in a transaction when children end), so one row that cannot be
// written would fail them all: on such an error the batch is split in
// halves, each retried on its own, until the row is alone; it is then
// reported as not held (its run halts and the task is taken over when its
// lease expires) and every other completion is recorded. A batch that
// fails on nothing costs nothing more.
func (s *Store) Finish(ctx context.Context, cs []store.Completion) ([]bool, error) {
	ok := make(map[api.TaskID]bool, len(cs))
	if err := s.finishIsolating(ctx, cs, ok); err != nil {
		return nil, fmt.Errorf("finish tasks: %w", err)
	}
	out := make([]bool, len(cs))
	for i, c := range cs {
		out[i] = ok[c.ID]
	}
	return out, nil
}

// finishIsolating records cs, splitting the batch around rows that cannot
// be written.
func (s *Store) finishIsolating(ctx context.Context, cs []store.Completion, ok map[api.TaskID]bool) error {
	err := s.finishBatch(ctx, cs, ok)
	if err == nil || !rowError(err) {
		return err
	}
	if len(cs) == 1 {
		ok[cs[0].ID] = false
		return nil
	}
	half := len(cs) / 2
	if err := s.finishIsolating(ctx, cs[:half], ok); err != nil {
		return err
	}
	return s.finishIsolating(ctx, cs[half:], ok)
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

// finishBatch records cs in one statement, and the ends of their children
// in the same transaction. It sets ok for the completions whose lease held.
func (s *Store) finishBatch(ctx context.Context, cs []store.Completion, ok map[api.TaskID]bool) error {
	n := len(cs)
	ids, statuses := make([]string, n), make([]string, n)
	leases := make([]pgtype.UUID, n)
	results, errs := make([]*string, n), make([]*string, n)
	again := make([]int64, n)
	waits := make([]bool, n)
	hasParent := false
	for i, c := range cs {
		ids[i], leases[i], statuses[i], waits[i] = string(c.ID), uuid(c.Lease), string(c.Status), c.WaitChildren
		hasParent = hasParent || c.HasParent
		if c.Result != nil {
			r := string(c.Result)
			results[i] = &r
		}
		if c.Error != nil {
			b, err := json.Marshal(c.Error)
			if err != nil {
				return fmt.Errorf("task %s: encode error: %w", c.ID, err)
			}
			e := string(b)
			errs[i] = &e
		}
		again[i] = -1
		if c.Again || c.WaitChildren {
			again[i] = max(c.Delay, 0).Microseconds()
		}
	}
	// A batch without children is one statement; with children, the
	// parents' counts change in the same transaction.
	run := func(ctx context.Context, fn func(pgx.Tx) error) error { return fn(nil) }
	if hasParent {
		run = func(ctx context.Context, fn func(pgx.Tx) error) error { return pgx.BeginFunc(ctx, s.pool, fn) }
	}
	done := make(map[api.TaskID]bool, n)
	err := run(ctx, func(tx pgx.Tx) error {
		var q querier = s.pool
		if tx != nil {
			q = tx
		}
		rows, err := q.Query(ctx, finishSQL, ids, leases, statuses, results, errs, again, waits)
		if err != nil {
			return err
		}
		var id, parent string
		var final bool
		var parents []string
		if _, err := pgx.ForEachRow(rows, []any{&id, &parent, &final}, func() error {
			done[api.TaskID(id)] = true
			if final && parent != "" {
				parents = append(parents, parent)
			}
			return nil
		}); err != nil {
			return err
		}
		if len(parents) > 0 {
			if tx == nil {
				return fmt.Errorf("tasks with parents were finished outside a transaction: set Completion.HasParent")
			}
			_, err = tx.Exec(ctx, childrenEndedSQL, parents)
		}
		return err
	})
	if err != nil {
		return err
	}
	for id := range done {
		ok[id] = true
	}
	return nil
}

// checkpointSQL stores a run's progress and records a progress event in
// the change feed, carrying the progress, unless the task had one less than
// a second ago: a fast checkpointer costs the feed at most one row per task
// and second. The event is the first of a burst; a reader that wants the
// latest progress reads the task.
const checkpointSQL = `
WITH u AS (
    UPDATE stint_task SET progress = $3::jsonb, updated_at = now(),
        progress_event_at = CASE WHEN progress_event_at > statement_timestamp() - interval '1 second'
            THEN progress_event_at ELSE statement_timestamp() END
    WHERE id = $1 AND lease = $2 AND status = 'running'
    RETURNING id, behavior, parent_id, progress, progress_event_at = statement_timestamp() AS announce
), feed AS (
    INSERT INTO stint_change (task_ids, behaviors, statuses, parent_ids, finals, progresses)
    SELECT ARRAY[id], ARRAY[behavior], ARRAY['running'], ARRAY[parent_id], ARRAY[false], ARRAY[progress]
    FROM u WHERE announce
)
SELECT count(*) FROM u`

// Checkpoint stores progress; see store.Store. It leaves the lease row
// alone: inside a caller's transaction a write to it would hold up the
// renewals of every run of the same claim until that transaction ends.
func (s *Store) Checkpoint(ctx context.Context, tx pgx.Tx, r store.LeaseRef, progress json.RawMessage) error {
	var q querier = s.pool
	if tx != nil {
		q = tx
	}
	var n int
	if err := q.QueryRow(ctx, checkpointSQL, string(r.ID), uuid(r.Lease), string(progress)).Scan(&n); err != nil {
		return fmt.Errorf("checkpoint task %s: %w", r.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("checkpoint task %s: %w", r.ID, api.ErrHalt)
	}
	return nil
}

// Unclaim gives running tasks back, due at once; see store.Store. As in
// a takeover, the next run covers a resubmit that came during this one.
func (s *Store) Unclaim(ctx context.Context, refs []store.LeaseRef) error {
	ids := make([]string, len(refs))
	leases := make([]pgtype.UUID, len(refs))
	for i, r := range refs {
		ids[i], leases[i] = string(r.ID), uuid(r.Lease)
	}
	_, err := s.pool.Exec(ctx, `
		WITH u AS (
		    UPDATE stint_task t SET status = 'scheduled', schedule_not_before = now(), lost_not_before = NULL,
		        executed_at = NULL, attempt = t.attempt - 1, resubmit = t.resubmit OR t.resubmitted, resubmit_due = NULL,
		        updated_at = now()
		    FROM unnest($1::text[], $2::uuid[]) AS r(id, lease)
		    WHERE t.id = r.id AND t.lease = r.lease AND t.status = 'running'
		    RETURNING t.id, t.behavior, t.parent_id, t.priority, t.schedule_not_before, t.group_key, t.status
		), due AS (`+dueInsert("u")+`)
		`+feedInsert("u", "'scheduled'::text", "false"), ids, leases)
	if err != nil {
		return fmt.Errorf("unclaim tasks: %w", err)
	}
	return nil
}

// RegisterNode records a node as started.
func (s *Store) RegisterNode(ctx context.Context, n store.Node) error {
	behaviors := make([]string, len(n.Behaviors))
	for i, b := range n.Behaviors {
		behaviors[i] = string(b)
	}
	_, err := s.pool.Exec(ctx, `
		INSERT INTO stint_node (id, host, pid, behaviors, max_workers) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET host = $2, pid = $3, behaviors = $4, max_workers = $5,
		    started_at = now(), heartbeat_at = now()`,
		n.ID, n.Host, n.PID, behaviors, n.MaxWorkers)
	if err != nil {
		return fmt.Errorf("register node %s: %w", n.ID, err)
	}
	return nil
}

// HeartbeatNode renews a node's heartbeat.
func (s *Store) HeartbeatNode(ctx context.Context, id string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE stint_node SET heartbeat_at = now() WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("heartbeat node %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("heartbeat node %s: %w", id, api.ErrNotFound)
	}
	return nil
}

// DeregisterNode removes a node.
func (s *Store) DeregisterNode(ctx context.Context, id string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM stint_node WHERE id = $1`, id); err != nil {
		return fmt.Errorf("deregister node %s: %w", id, err)
	}
	return nil
}

// Nodes lists registered nodes, oldest first.
func (s *Store) Nodes(ctx context.Context) ([]store.Node, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, host, pid, behaviors, max_workers, started_at, heartbeat_at
		FROM stint_node ORDER BY started_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var out []store.Node
	var n store.Node
	var behaviors []string
	_, err = pgx.ForEachRow(rows, []any{&n.ID, &n.Host, &n.PID, &behaviors, &n.MaxWorkers, &n.StartedAt, &n.HeartbeatAt}, func() error {
		n.Behaviors = make([]api.BehaviorID, len(behaviors))
		for i, b := range behaviors {
			n.Behaviors[i] = api.BehaviorID(b)
		}
		out = append(out, n)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}
