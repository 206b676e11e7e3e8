package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// workflowInsertSQL stores the task that stands for a workflow: waiting,
// with no due time, for its $8 nodes to end (children_pending, which
// childrenEndedSQL counts down and which makes it due once it reaches
// zero). An existing task of the id is left as it is, and no row returns.
var workflowInsertSQL = `
WITH s AS (
    INSERT INTO stint_task AS t (id, behavior, params, priority, status, schedule_not_before, trace, awaited, retention_us,
        waiting_children, children_pending, deps_pending)
    VALUES ($1, $2, $3::jsonb, $4, 'waiting', NULL, nullif($5, ''), $6, nullif($7::bigint, 0), true, $8, 0)
    ON CONFLICT (id) DO NOTHING
    RETURNING t.id, t.behavior, t.status, t.parent_id
), feed AS (` + feedInsert("s", "status", "false") + `)
SELECT count(*) FROM s`

// workflowNodesSQL stores workflow nodes, each as its verdict says: run
// (scheduled, due after its delay), skip (a failure with code skipped and
// the message given) or wait (waiting), with its counts of dependencies
// by outcome; of a held workflow ($20), a node that may run is held, due
// once released. It adds the claim hints of the scheduled ones, records
// the nodes in the change feed and wakes the claimers.
var workflowNodesSQL = `
WITH s AS (
    INSERT INTO stint_task AS t (id, behavior, params, priority, status, schedule_not_before, group_key, parent_id, trace,
        awaited, retention_us, rate_uses, workflow_node, dep_rule, deps_pending, deps_succeeded, deps_failed, deps_skipped,
        error, finished_at, held_due, version)
    SELECT r.id, r.behavior, r.params::jsonb, r.priority,
        CASE r.verdict WHEN 'run' THEN CASE WHEN $20 THEN 'held' ELSE 'scheduled' END WHEN 'skip' THEN 'failure' ELSE 'waiting' END,
        CASE WHEN r.verdict = 'run' AND NOT $20 THEN now() + r.delay_us * interval '1 microsecond' END,
        nullif(r.group_key, ''), $13, nullif(r.trace, ''), r.awaited, nullif(r.retention_us, 0),
        nullif(r.rate_uses, '')::jsonb, r.name, r.rule, r.pending, r.ok, r.failed, r.skipped,
        CASE WHEN r.verdict = 'skip' THEN jsonb_build_object('retryable', false, 'code', '` + api.CodeSkipped + `', 'message', r.why) END,
        CASE WHEN r.verdict = 'skip' THEN now() END,
        CASE WHEN r.verdict = 'run' AND $20 THEN now() + r.delay_us * interval '1 microsecond' END,
        nullif(r.version, 0)
    FROM ` + unnestRows("r", "id $1::text[]", "behavior $2::text[]", "params $3::text[]", "priority $4::smallint[]",
	"delay_us $5::bigint[]", "group_key $6::text[]", "trace $7::text[]", "awaited $8::bool[]", "retention_us $9::bigint[]",
	"rate_uses $10::text[]", "name $11::text[]", "rule $12::text[]", "pending $14::bigint[]", "ok $15::bigint[]",
	"failed $16::bigint[]", "skipped $17::bigint[]", "verdict $18::text[]", "why $19::text[]", "version $21::int[]") + `
    RETURNING t.id, t.behavior, t.priority, t.schedule_not_before, t.group_key, t.status, t.parent_id
), due AS (` + dueInsert("s") + `
), feed AS (` + feedInsert("s", "status", "status = 'failure'") + `
), wake AS (
    SELECT pg_notify('` + store.ChannelDue + `', '') FROM (SELECT 1 FROM s WHERE status = 'scheduled' LIMIT 1) d
)
SELECT count(*) FROM s LEFT JOIN wake ON true`

// workflowEdgesSQL stores a workflow's edges.
var workflowEdgesSQL = `INSERT INTO stint_dependency (depends_on, task_id) SELECT * FROM ` +
	unnestRows("e", "depends_on $1::text[]", "task_id $2::text[]")

// SubmitWorkflow stores a workflow; see store.Workflows.
func (s *Store) SubmitWorkflow(ctx context.Context, tx pgx.Tx, wf store.NewWorkflow) (created bool, err error) {
	var db interface {
		Begin(context.Context) (pgx.Tx, error)
	} = s.pool
	if tx != nil {
		db = tx // a savepoint: a failure leaves the caller's transaction usable
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		t := wf.Task
		var n int
		if err := tx.QueryRow(ctx, workflowInsertSQL, string(t.ID), string(t.Behavior), string(t.Params), t.Priority,
			t.Trace, t.Notify, t.Retention.Microseconds(), len(wf.Nodes)).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			// The id is taken: by this workflow (a second submit stores
			// nothing) or by a task that is not a workflow.
			var behavior string
			if err := tx.QueryRow(ctx, `SELECT behavior FROM stint_task WHERE id = $1`, string(t.ID)).Scan(&behavior); err != nil {
				return err
			}
			if behavior != string(api.WorkflowBehavior) {
				return fmt.Errorf("task %s is of behavior %s, not a workflow: %w", t.ID, behavior, api.ErrConflict)
			}
			return nil
		}
		created = true
		states := make([]nodeState, len(wf.Nodes))
		for i, deps := range wf.DependsOn {
			if states[i].pending = len(deps); len(deps) == 0 {
				states[i].verdict = "run"
			}
		}
		if err := tx.QueryRow(ctx, workflowNodesSQL, workflowNodeArgs(wf.Task.ID, wf.Nodes, wf.Names, wf.Rules, states, false)...).Scan(&n); err != nil {
			return err
		}
		var from, to textArray
		for i, deps := range wf.DependsOn {
			for _, d := range deps {
				from, to = append(from, string(wf.Nodes[d].ID)), append(to, string(wf.Nodes[i].ID))
			}
		}
		if len(from) > 0 {
			if _, err := tx.Exec(ctx, workflowEdgesSQL, from, to); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			err = api.Invalid("nodes", "a node's task id is taken by another task: %s", pgErr.Detail)
		}
		return false, fmt.Errorf("submit workflow %s: %w", wf.Task.ID, err)
	}
	return created, nil
}

// nodeState is how a node is stored: its counts of dependencies by
// outcome, and its verdict (see workflowNodesSQL) with the message of a
// skip.
type nodeState struct {
	pending, ok, failed, skipped int
	verdict, why                 string
}

// workflowNodeArgs returns the parameters of workflowNodesSQL for the
// nodes tasks of workflow id, named names, with rules and states; held
// says whether the workflow is held.
func workflowNodeArgs(id api.TaskID, tasks []store.NewTask, names []string, rules []api.Rule, states []nodeState, held bool) []any {
	n := len(tasks)
	ids, behaviors, params := make(textArray, n), make(textArray, n), make(textArray, n)
	priorities, delays, retentions := make(intArray, n), make(intArray, n), make(intArray, n)
	pending, ok, failed, skipped := make(intArray, n), make(intArray, n), make(intArray, n), make(intArray, n)
	groups, traces, uses, rs := make(textArray, n), make(textArray, n), make(textArray, n), make(textArray, n)
	verdicts, whys, versions := make(textArray, n), make(textArray, n), make(intArray, n)
	awaited := make(boolArray, n)
	for i, t := range tasks {
		ids[i], behaviors[i], params[i] = string(t.ID), string(t.Behavior), string(t.Params)
		priorities[i], delays[i], retentions[i] = int64(t.Priority), t.Delay.Microseconds(), t.Retention.Microseconds()
		groups[i], traces[i], awaited[i], versions[i] = t.GroupKey, t.Trace, t.Notify, int64(t.Version)
		if len(t.RateUses) > 0 {
			b, _ := json.Marshal(t.RateUses) // strings and numbers: cannot fail
			uses[i] = string(b)
		}
		st := states[i]
		rs[i], verdicts[i], whys[i] = string(rules[i]), st.verdict, st.why
		pending[i], ok[i], failed[i], skipped[i] = int64(st.pending), int64(st.ok), int64(st.failed), int64(st.skipped)
	}
	return []any{ids, behaviors, params, priorities, delays, groups, traces, awaited, retentions, uses, textArray(names), rs,
		string(id), pending, ok, failed, skipped, verdicts, whys, held, versions}
}

// WorkflowNodes returns a workflow's nodes; see store.Workflows. Two
// statements read them, whatever the workflow's size: the nodes by the
// parent index, and the workflow's edges by a range of stint_dependency's
// task index (node ids are the workflow's id, "/" and the node's name,
// and sort as bytes). A waiting node's dependencies not ended are found
// among the nodes read. A query per node took a second for 10,000 nodes.
func (s *Store) WorkflowNodes(ctx context.Context, id api.TaskID) ([]store.WorkflowNode, error) {
	b := &pgx.Batch{}
	b.Queue(`SELECT `+nodeColumns+`, workflow_node, coalesce(dep_rule, '')
		FROM stint_task WHERE parent_id = $1 AND workflow_node IS NOT NULL ORDER BY workflow_node`, string(id))
	// '0' follows '/' in bytes: the range holds exactly the ids id + "/" + name.
	b.Queue(workflowEdgesOfSQL, string(id)+"/", string(id)+"0")
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	nodes, err := readNodes(br)
	if err == nil {
		err = readEdges(br, id, nodes)
	}
	if err == nil {
		err = br.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("read workflow %s: %w", id, err)
	}
	ended := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		ended[n.Name] = n.Task.Finished()
	}
	for i, n := range nodes {
		if n.Task.Status != api.StatusWaiting || n.Task.Waiting != nil {
			continue
		}
		w := &api.Wait{Reason: api.WaitDependencies, Dependencies: []string{}}
		for _, d := range n.DependsOn {
			if !ended[d] {
				w.Dependencies = append(w.Dependencies, d)
			}
		}
		nodes[i].Task.Waiting = w
	}
	return nodes, nil
}

// workflowEdgesOfSQL reads the edges of a workflow, by the range [$1, $2)
// of its nodes' ids in stint_dependency's task index (see WorkflowNodes).
const workflowEdgesOfSQL = `SELECT task_id, depends_on FROM stint_dependency WHERE task_id >= $1 AND task_id < $2 ORDER BY task_id, depends_on`

// readNodes reads WorkflowNodes' nodes, in name order.
func readNodes(br pgx.BatchResults) ([]store.WorkflowNode, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.WorkflowNode
	for rows.Next() {
		var n store.WorkflowNode
		var rule string
		t, err := scanTask(withTail{rows, []any{&n.Name, &rule}})
		if err != nil {
			return nil, err
		}
		n.Task, n.Rule = t, api.Rule(rule)
		if n.Rule == store.RuleFinally {
			n.Rule, n.Finally = api.RuleAllEnded, true
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// readEdges reads WorkflowNodes' edges of workflow id into the nodes'
// DependsOn, in name order.
func readEdges(br pgx.BatchResults, id api.TaskID, nodes []store.WorkflowNode) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	at := make(map[string]int, len(nodes))
	for i, n := range nodes {
		at[n.Name] = i
	}
	prefix := string(id) + "/"
	var task, dep string
	_, err = pgx.ForEachRow(rows, []any{&task, &dep}, func() error {
		i, ok := at[strings.TrimPrefix(task, prefix)]
		if ok && strings.HasPrefix(dep, prefix) {
			nodes[i].DependsOn = append(nodes[i].DependsOn, dep[len(prefix):])
		}
		return nil
	})
	return err
}

// withTail is a row whose Scan fills tail after the destinations it is
// given: scanTask's columns, then more.
type withTail struct {
	pgx.Row
	tail []any
}

func (r withTail) Scan(dest ...any) error { return r.Row.Scan(append(dest, r.tail...)...) }

// WorkflowCounts counts a workflow's nodes; see store.Workflows.
func (s *Store) WorkflowCounts(ctx context.Context, id api.TaskID) ([]store.WorkflowCount, error) {
	rows, err := s.pool.Query(ctx, `SELECT status, CASE WHEN status = 'failure' THEN coalesce(error->>'code', '') ELSE '' END, count(*)
		FROM stint_task WHERE parent_id = $1 AND workflow_node IS NOT NULL GROUP BY 1, 2`, string(id))
	if err != nil {
		return nil, fmt.Errorf("count nodes of workflow %s: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.WorkflowCount, error) {
		var c store.WorkflowCount
		err := r.Scan(&c.Status, &c.Code, &c.N)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count nodes of workflow %s: %w", id, err)
	}
	return out, nil
}

// cancelWorkflowSQL ends the nodes of workflow $1 that have not ended as
// cancelled failures, and returns them. A running node's run is fenced
// out: its lease no longer holds a running task, so its next write halts
// it and its finish changes nothing. A held workflow with nodes to cancel
// is released (a cancelled workflow has nothing left to hold): its own
// task waits for its nodes' ends as any workflow's does, and records the
// outcome once they are counted.
var cancelWorkflowSQL = `
WITH u AS (
    UPDATE stint_task t SET status = 'failure', schedule_not_before = NULL, lost_not_before = NULL, finished_at = now(),
        updated_at = now(), resubmit = false,
        error = jsonb_build_object('retryable', false, 'code', '` + api.CodeCancelled + `', 'message', 'the workflow was cancelled')
    WHERE t.parent_id = $1 AND t.workflow_node IS NOT NULL
      AND (t.status IN ('waiting', 'scheduled', 'held', 'running') OR t.schedule_not_before IS NOT NULL)
    RETURNING t.id, t.behavior, t.status, t.parent_id, t.awaited
), released AS (
    UPDATE stint_task SET status = 'waiting', held_due = NULL, waiting_children = true, updated_at = now()
    WHERE ` + isWorkflow + ` AND status = 'held' AND EXISTS (SELECT 1 FROM u)
    RETURNING id, behavior, status, parent_id
), feed AS (` + feedInsert("(SELECT id, behavior, status, parent_id, true AS final FROM u UNION ALL SELECT id, behavior, status, parent_id, false FROM released) x", "status", "final") + `
), ` + waitsEnded("SELECT id FROM u") + `, notified AS (
    SELECT count(pg_notify('` + store.ChannelFinished + `', id)) AS n FROM u WHERE awaited
)
SELECT ARRAY(SELECT id FROM u) FROM notified`

// CancelWorkflow cancels a workflow; see store.Workflows.
func (s *Store) CancelWorkflow(ctx context.Context, id api.TaskID) (int, error) {
	var ended int
	err := retryDeadlock(ctx, s.pool, func(tx pgx.Tx) error {
		var behavior string
		if err := tx.QueryRow(ctx, `SELECT behavior FROM stint_task WHERE id = $1 FOR UPDATE`, string(id)).Scan(&behavior); err != nil {
			if isNoRows(err) {
				return api.ErrNotFound
			}
			return err
		}
		if behavior != string(api.WorkflowBehavior) {
			return api.ErrNotFound
		}
		var cancelled []string
		if err := tx.QueryRow(ctx, cancelWorkflowSQL, string(id)).Scan(&cancelled); err != nil {
			return err
		}
		ended = len(cancelled)
		if ended == 0 {
			return fmt.Errorf("its nodes have all ended: %w", api.ErrConflict)
		}
		parents := make(textArray, ended)
		for i := range parents {
			parents[i] = string(id)
		}
		_, err := nodesEnded(ctx, tx, parents, cancelled, nil, nil, false)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("cancel workflow %s: %w", id, err)
	}
	return ended, nil
}

// RetryWorkflow runs a failed or cancelled workflow again; see
// store.Workflows.
func (s *Store) RetryWorkflow(ctx context.Context, id api.TaskID) (int, error) {
	n, err := s.retry(ctx, id, id)
	if err != nil {
		return 0, fmt.Errorf("retry workflow %s: %w", id, err)
	}
	return n, nil
}

// retry runs workflow wf again from its node: every failed node, when
// node is the workflow itself (see retryNodes).
func (s *Store) retry(ctx context.Context, wf, node api.TaskID) (int, error) {
	var n int
	err := retryDeadlock(ctx, s.pool, func(tx pgx.Tx) error {
		var status string
		err := tx.QueryRow(ctx, `SELECT status FROM stint_task WHERE `+isWorkflow+` FOR UPDATE`, string(wf)).Scan(&status)
		if isNoRows(err) {
			return api.ErrNotFound
		}
		if err != nil {
			return err
		}
		n, err = retryNodes(ctx, tx, wf, status == string(api.StatusHeld), node == wf, node)
		return err
	})
	return n, err
}
