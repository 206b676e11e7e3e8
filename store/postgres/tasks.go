package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
)

// taskColumns is the column list scanned by scanTask, and briefColumns
// the same without the params, result and progress (NULL in their place).
var (
	taskColumns  = taskColumnsBase + taskColumnsEnd
	briefColumns = `id, behavior, status, priority, NULL::jsonb, NULL::jsonb, error, NULL::jsonb, ` + taskColumnsRest + taskColumnsEnd
)

// taskColumnsEnd ends taskColumnsBase's last CASE for one task read alone.
var taskColumnsEnd = `
	    WHEN status = 'waiting' AND workflow_node IS NOT NULL THEN ` + waitingOnDependencies + ` END`

// nodeColumns are taskColumns for the nodes of one workflow read together:
// what a waiting node waits on is left NULL, for the reader to fill in
// from the other nodes' states (see WorkflowNodes) rather than by a query
// per node.
var nodeColumns = taskColumnsBase + ` END`

// taskColumnsBase is taskColumns up to its last CASE, which it leaves open.
var taskColumnsBase = `id, behavior, status, priority, params, result, error, progress, ` + taskColumnsRest

// taskColumnsRest is taskColumnsBase after the payloads.
var taskColumnsRest = `
	` + leaseExpiry("schedule_not_before") + `, ` + leaseExpiry("lost_not_before") + `,
	lease, coalesce(node, ''), attempt, errors, resubmit,
	coalesce(parent_id, ''), coalesce(group_key, ''), coalesce(trace, ''),
	created_at, updated_at, executed_at, finished_at, awaited, children_pending, coalesce(retention_us, 0), coalesce(version, 0),
	CASE WHEN signal_wait IS NOT NULL AND status = 'scheduled' AND schedule_not_before > now() THEN jsonb_build_object('reason', '` + api.WaitSignal + `',
	        'limit', '', 'key', signal_wait, 'detail', 'signal ' || signal_wait)
	    WHEN status IN ` + waitingStatuses + ` AND schedule_not_before IS NOT NULL THEN waiting`

// waitingOnDependencies is the api.Wait of a waiting workflow node of
// stint_task: the names of its dependencies that have not ended.
const waitingOnDependencies = `(SELECT jsonb_build_object('reason', '` + api.WaitDependencies + `', 'limit', '',
	    'dependencies', coalesce(jsonb_agg(d.workflow_node ORDER BY d.workflow_node), '[]'))
	FROM (SELECT e.depends_on FROM stint_dependency e WHERE e.task_id = stint_task.id
	    UNION ALL SELECT stint_task.depends_on WHERE stint_task.depends_on IS NOT NULL) e
	JOIN stint_task d ON d.id = ANY(ARRAY[e.depends_on])
	WHERE NOT (d.status IN ('success', 'failure') AND d.schedule_not_before IS NULL))`

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
		retention int64
		waiting   []byte
	)
	err := row.Scan(&id, &behaviour, &status, &t.Priority, &params, &result, &errJSON, &progress,
		&t.ScheduleNotBefore, &t.LostNotBefore, &lease, &t.Node, &t.Attempt, &t.Errors, &t.Resubmit,
		&parentID, &t.GroupKey, &t.Trace, &t.CreatedAt, &t.UpdatedAt, &t.ExecutedAt, &t.FinishedAt, &t.Notify, &t.ChildrenPending, &retention, &t.Version, &waiting)
	if err != nil {
		if isNoRows(err) {
			return t, api.ErrNotFound
		}
		return t, err
	}
	t.ID, t.Behavior, t.Status, t.ParentID = api.TaskID(id), api.BehaviorID(behaviour), api.Status(status), api.TaskID(parentID)
	t.Params, t.Result, t.Progress = params, result, progress
	t.Retention = time.Duration(retention) * time.Microsecond
	if lease != nil {
		t.Lease = formatUUID(*lease)
	}
	if waiting != nil {
		t.Waiting = new(api.Wait)
		if err := json.Unmarshal(waiting, t.Waiting); err != nil {
			return t, fmt.Errorf("decode wait of task %s: %w", id, err)
		}
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

// Get returns a task. A task the standby does not have (yet) is looked up
// on the primary, so that a Get after a Submit finds it.
func (s *Store) Get(ctx context.Context, id api.TaskID) (api.Task, error) {
	var t api.Task
	err := s.reading(ctx, func(db *pgxpool.Pool, standby bool) error {
		var err error
		t, err = scanTask(indexedRow(ctx, db, getTaskSQL, id))
		if err == api.ErrNotFound && standby {
			t, err = scanTask(indexedRow(ctx, s.pool, getTaskSQL, id))
		}
		return err
	})
	if err != nil && err != api.ErrNotFound {
		return t, fmt.Errorf("get task %s: %w", id, err)
	}
	return t, err
}

// getTaskSQL reads the task $1 (an await's poll).
var getTaskSQL = `SELECT ` + taskColumns + ` FROM stint_task WHERE id = $1`

// markAwaitedSQL sets the awaited flag of the task $1, unless it finished
// for good, and returns it: as written, or else as the statement's
// snapshot shows it. A finished row is left alone: the client role may
// not write one (its row-level security refuses the write), and its
// finish notified or not already. A task it returns without the flag, and
// not finished, finished after the statement began (see MarkAwaited).
var markAwaitedSQL = `
WITH u AS (
    UPDATE stint_task SET awaited = true
    WHERE id = $1 AND NOT (status IN ('success', 'failure') AND schedule_not_before IS NULL)
    RETURNING ` + taskColumns + `
)
SELECT * FROM u
UNION ALL
SELECT ` + taskColumns + ` FROM stint_task WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM u)`

// MarkAwaited sets the awaited flag and returns the task as of that write,
// or, finished, as it is; see store.Store.
func (s *Store) MarkAwaited(ctx context.Context, id api.TaskID) (api.Task, error) {
	t, err := scanTask(indexedRow(ctx, s.pool, markAwaitedSQL, id))
	if err == nil && !t.Finished() && !t.Notify {
		// It finished after markAwaitedSQL's snapshot: a statement of its
		// own sees the end.
		t, err = scanTask(indexedRow(ctx, s.pool, getTaskSQL, id))
	}
	if err != nil && err != api.ErrNotFound {
		return t, fmt.Errorf("mark task %s awaited: %w", id, err)
	}
	return t, err
}

// List returns a page of tasks in id order.
func (s *Store) List(ctx context.Context, f api.Filter) (api.Page, error) {
	limit := pageLimit(f.Limit)
	var page api.Page
	err := s.reading(ctx, func(db *pgxpool.Pool, _ bool) error {
		var err error
		page, err = listTasks(ctx, db, f, limit)
		return err
	})
	return page, err
}

// pageLimit is the size of a page asked for with limit: 100 when limit
// is not positive, at most 1000.
func pageLimit(limit int) int {
	if limit <= 0 {
		return 100
	}
	return min(limit, 1000)
}

// listTasksSQL reads a page of tasks, and listBriefSQL one without their
// params, result and progress (api.Filter.Brief): the statements differ
// in their column lists alone.
var (
	listTasksSQL = `SELECT ` + taskColumns + listTasksFrom
	listBriefSQL = `SELECT ` + briefColumns + listTasksFrom
)

// listTasksFrom is the rest of listTasksSQL after its columns.
const listTasksFrom = ` FROM stint_task
		WHERE ($1 = '' OR behavior = $1) AND ($2 = '' OR status = $2)
		  AND ($3 = '' OR parent_id = $3) AND ($4 = '' OR group_key = $4) AND id > $5
		ORDER BY id LIMIT $6`

// listTasks reads a page of at most limit tasks on db.
func listTasks(ctx context.Context, db *pgxpool.Pool, f api.Filter, limit int) (api.Page, error) {
	query := listTasksSQL
	if f.Brief {
		query = listBriefSQL
	}
	page, err := readPage(ctx, db, limit, query,
		string(f.Behavior), string(f.Status), string(f.ParentID), f.GroupKey, string(f.After), limit+1)
	if err != nil {
		return page, fmt.Errorf("list tasks: %w", err)
	}
	return page, nil
}

// readPage reads a page of at most limit tasks with query, which selects
// taskColumns in id order, at most limit+1 rows: the one past the page
// says that another follows.
func readPage(ctx context.Context, db *pgxpool.Pool, limit int, query string, args ...any) (api.Page, error) {
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		return api.Page{}, err
	}
	defer rows.Close()
	page := api.Page{Tasks: []api.Task{}}
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			return api.Page{}, err
		}
		page.Tasks = append(page.Tasks, t)
	}
	if err := rows.Err(); err != nil {
		return api.Page{}, err
	}
	if len(page.Tasks) > limit {
		page.Tasks = page.Tasks[:limit]
		page.Next = page.Tasks[limit-1].ID
	}
	return page, nil
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
//
// A hint of a paused behavior or a held group key is added parked, out of
// the claim index. The pause or hold row found is share-locked: a resume or
// release that changes it waits for this statement's transaction and then
// unparks the hint; one that committed first is seen here (a locking read
// takes the row's newest version), and the hint is not parked. A row that
// a resume, release or lease change holds locked is skipped, so that the
// statement never waits: its hint stays in the claim index, where a claim
// still leaves it while the pause or hold lasts. The pause and hold rows
// of the statement's behaviors and keys are looked up once, not per hint.
func dueInsert(from string) string {
	return `
    INSERT INTO stint_due (id, behavior, priority, due, group_key, parked)
    SELECT n.id, n.behavior, n.priority, n.schedule_not_before, n.group_key,
        n.behavior IN (SELECT pb.behavior FROM stint_behavior pb
            WHERE pb.paused AND pb.behavior IN (SELECT behavior FROM ` + from + `) FOR SHARE SKIP LOCKED)
        OR (n.group_key IS NOT NULL AND n.group_key IN (SELECT ph.group_key FROM stint_hold ph
            WHERE ph.group_key IN (SELECT group_key FROM ` + from + `) FOR SHARE SKIP LOCKED))
    FROM (SELECT id, behavior, priority, schedule_not_before, group_key, status FROM ` + from + `) n
    WHERE n.schedule_not_before IS NOT NULL AND n.status IN ` + waitingStatuses
}

// waitingStatuses are the statuses of a task that waits to run when it has
// a due time: scheduled, or finished and due again (a recurring task).
const waitingStatuses = `('scheduled', 'success', 'failure')`

// hintMatches returns the condition under which the hint d (a row of
// stint_due) still stands for the task t: the task waits to run at the
// hint's due time and priority. Claims take only such hints; counts of the
// backlog count only them.
func hintMatches(t, d string) string {
	return t + `.id = ` + d + `.id AND ` + hintState(t, d)
}

// hintProbe is hintMatches for the claims: the task is found by a probe of
// the primary key per hint (see seqscanOffSQL), where a count of the
// backlog may join all hints to all tasks at once.
func hintProbe(t, d string) string {
	return t + `.id = ANY(ARRAY[` + d + `.id]) AND ` + hintState(t, d)
}

// hintState is the part of hintMatches that compares the task's state.
func hintState(t, d string) string {
	return t + `.status IN ` + waitingStatuses + `
      AND ` + t + `.schedule_not_before = ` + d + `.due AND ` + t + `.priority = ` + d + `.priority`
}
