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
    VALUES ($1, $2, $3::jsonb, $4, 'waiting', NULL, nullif($5, ''), $6, nullif($7, 0), true, $8, 0)
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
        error, finished_at, held_due)
    SELECT r.id, r.behavior, r.params::jsonb, r.priority,
        CASE r.verdict WHEN 'run' THEN CASE WHEN $20 THEN 'held' ELSE 'scheduled' END WHEN 'skip' THEN 'failure' ELSE 'waiting' END,
        CASE WHEN r.verdict = 'run' AND NOT $20 THEN now() + r.delay_us * interval '1 microsecond' END,
        nullif(r.group_key, ''), $13, nullif(r.trace, ''), r.awaited, nullif(r.retention_us, 0),
        nullif(r.rate_uses, '')::jsonb, r.name, r.rule, r.pending, r.ok, r.failed, r.skipped,
        CASE WHEN r.verdict = 'skip' THEN jsonb_build_object('retryable', false, 'code', '` + api.CodeSkipped + `', 'message', r.why) END,
        CASE WHEN r.verdict = 'skip' THEN now() END,
        CASE WHEN r.verdict = 'run' AND $20 THEN now() + r.delay_us * interval '1 microsecond' END
    FROM unnest($1::text[], $2::text[], $3::text[], $4::smallint[], $5::bigint[], $6::text[], $7::text[], $8::bool[],
        $9::bigint[], $10::text[], $11::text[], $12::text[], $14::bigint[], $15::bigint[], $16::bigint[], $17::bigint[],
        $18::text[], $19::text[])
        AS r(id, behavior, params, priority, delay_us, group_key, trace, awaited, retention_us, rate_uses, name, rule,
            pending, ok, failed, skipped, verdict, why)
    RETURNING t.id, t.behavior, t.priority, t.schedule_not_before, t.group_key, t.status, t.parent_id
), due AS (` + dueInsert("s") + `
), feed AS (` + feedInsert("s", "status", "status = 'failure'") + `
), wake AS (
    SELECT pg_notify('` + store.ChannelDue + `', '') FROM (SELECT 1 FROM s WHERE status = 'scheduled' LIMIT 1) d
)
SELECT count(*) FROM s LEFT JOIN wake ON true`

// workflowEdgesSQL stores a workflow's edges.
const workflowEdgesSQL = `INSERT INTO stint_dependency (depends_on, task_id) SELECT * FROM unnest($1::text[], $2::text[])`

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
			err = &api.InvalidError{Field: "nodes", Reason: "a node's task id is taken by another task: " + pgErr.Detail, Err: err}
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
	verdicts, whys := make(textArray, n), make(textArray, n)
	awaited := make(boolArray, n)
	for i, t := range tasks {
		ids[i], behaviors[i], params[i] = string(t.ID), string(t.Behavior), string(t.Params)
		priorities[i], delays[i], retentions[i] = int64(t.Priority), t.Delay.Microseconds(), t.Retention.Microseconds()
		groups[i], traces[i], awaited[i] = t.GroupKey, t.Trace, t.Notify
		if len(t.RateUses) > 0 {
			b, _ := json.Marshal(t.RateUses) // strings and numbers: cannot fail
			uses[i] = string(b)
		}
		st := states[i]
		rs[i], verdicts[i], whys[i] = string(rules[i]), st.verdict, st.why
		pending[i], ok[i], failed[i], skipped[i] = int64(st.pending), int64(st.ok), int64(st.failed), int64(st.skipped)
	}
	return []any{ids, behaviors, params, priorities, delays, groups, traces, awaited, retentions, uses, textArray(names), rs,
		string(id), pending, ok, failed, skipped, verdicts, whys, held}
}

// depsEndedSQL counts the tasks $1, which ended for good, and those of $6
// whose workflow grew at run time (see nodesEnded), off the dependents
// that wait for them, and decides each dependent its count
// changed by its rule: it runs (scheduled, due now, with its claim hint),
// it is skipped (a failure with code skipped whose message names the
// dependency that decided it), or it waits on. It returns the skipped
// dependents and their parents (the workflows), whose ends the caller
// counts in turn, as finishes count their tasks', in the same transaction.
//
// Each dependent is found, counted and decided by one UPDATE: its new
// counts and its verdict are computed in the SET from the row as the
// update finds it, so that two finishes of its dependencies at once are
// ordered by its row lock and the second, re-reading the row the first
// committed, sees every other's count. A fan-out's root thus reads and
// writes each dependent once. Each ended task is read once, each of their
// workflows once (a dependent is of its dependency's workflow: a node of a
// held workflow that may run is stored held, due once released), and an
// ended task's edges are found by a probe of the edge index (an index
// scan: see probesSaveOffSQL): OFFSET 0 keeps the lateral subqueries from
// being flattened into joins, which the planner made a merge join over the
// whole index.
//
// A dependent that runs may start at once on the node $2 (a local start,
// see store.Store.FinishStart) when the finish touched no more dependents
// than the $5 runs the node has room for: then every one of them that
// runs and is of the behaviors $3 (with their leases $4, unless an
// operator set one) starts running under a fresh lease per behavior, as a
// claim starts it, with no claim hint, when a claim could take it now:
// its behavior neither paused nor capped at runtime, its group key not
// held, no rate uses, and no due hint of its behavior with the same or a
// lower priority number in the claim index (a local start never jumps a
// task the claimers would take before it). A finish that touches more
// (a wide fan-out) leaves them all to the claimers, which take them in
// priority order at once, rather than choosing among them here: the
// local start saves a round trip, which counts for a chain's hop and not
// for ten thousand nodes. The pause and hold rows are read as the starting
// submit reads them (see submitStatement). A started node's run and lease
// count from the statement's time, not the transaction's, which may have
// waited for its workflow's row. A node started so has two events in the
// change feed, scheduled (ready) and running, as one a claim starts has.
// The statement also returns the started tasks (with their params and
// progress, which the others leave out), as JSON.
var depsEndedSQL = `
WITH d AS MATERIALIZED (
    SELECT x.id, d.status, d.error->>'code' AS code, d.workflow_node, d.parent_id
    FROM (SELECT unnest($1::text[]) AS id
        UNION ALL
        SELECT o.id FROM unnest($6::text[]) AS o(id)
        WHERE split_part(o.id, '/', 1) = ANY(ARRAY(SELECT w.id FROM stint_task w
            WHERE w.id = ANY(ARRAY(SELECT DISTINCT split_part(o.id, '/', 1) FROM unnest($6::text[]) AS o(id)))
              AND w.params ? 'grown'))) x,
        LATERAL (SELECT d.status, d.error, d.workflow_node, d.parent_id FROM stint_task d WHERE d.id = x.id OFFSET 0) d
), ended AS MATERIALIZED (
    SELECT e.task_id,
        count(*) AS n,
        count(*) FILTER (WHERE d.status = 'success') AS ok,
        count(*) FILTER (WHERE d.status <> 'success' AND coalesce(d.code, '') <> '` + api.CodeSkipped + `') AS failed,
        count(*) FILTER (WHERE d.code = '` + api.CodeSkipped + `') AS skipped,
        min(d.workflow_node) FILTER (WHERE d.status <> 'success') AS bad,
        bool_or(d.parent_id = ANY(ARRAY(SELECT w.id FROM stint_task w
            WHERE w.id = ANY(ARRAY(SELECT DISTINCT parent_id FROM d)) AND w.status = 'held'))) AS held
    FROM d, LATERAL (SELECT e.task_id FROM stint_dependency e WHERE e.depends_on = d.id COLLATE "C" OFFSET 0) e
    GROUP BY e.task_id
), local AS MATERIALIZED (
    SELECT t.behavior, t.priority, t.group_key
    FROM ended e JOIN stint_task t ON t.id = ANY(ARRAY[e.task_id])
    WHERE (SELECT count(*) FROM ended) <= $5::int
      AND t.status = 'waiting' AND t.rate_uses IS NULL AND e.held IS NOT TRUE
), cfg AS MATERIALIZED (
    SELECT w.behavior, coalesce(b.lease_ms * 1000, w.lease_us) AS lease_us, gen_random_uuid() AS lease,
        (SELECT d.priority FROM stint_due d WHERE NOT d.parked AND d.behavior = w.behavior
             AND d.priority <= (SELECT max(priority) FROM local) AND d.due <= now()
         ORDER BY d.priority, d.due LIMIT 1) AS first
    FROM unnest($3::text[], $4::bigint[]) AS w(behavior, lease_us)
    LEFT JOIN stint_behavior b ON b.behavior = w.behavior
    WHERE w.behavior = ANY(ARRAY(SELECT behavior FROM local)) AND b.paused IS NOT TRUE AND ` + uncapped("w.behavior") + `
), paused AS MATERIALIZED (
    SELECT pb.behavior FROM stint_behavior pb
    WHERE pb.paused AND pb.behavior IN (SELECT behavior FROM cfg) FOR SHARE SKIP LOCKED
), held AS MATERIALIZED (
    SELECT ph.group_key FROM stint_hold ph
    WHERE ph.group_key = ANY(ARRAY(SELECT group_key FROM local WHERE behavior IN (SELECT behavior FROM cfg)))
    FOR SHARE SKIP LOCKED
), u AS (
    UPDATE stint_task t SET (deps_pending, deps_succeeded, deps_failed, deps_skipped, status, schedule_not_before, held_due,
            error, finished_at, lease, node, attempt, executed_at, lost_not_before, waiting_children, resubmitted, resubmit,
            updated_at) = (
        SELECT v.pending, v.ok, v.failed, v.skipped,
            CASE WHEN g.lease IS NOT NULL THEN 'running' ELSE CASE v.verdict
                WHEN 'run' THEN CASE WHEN e.held THEN 'held' ELSE 'scheduled' END
                WHEN 'skip' THEN 'failure' ELSE 'waiting' END END,
            CASE WHEN v.verdict = 'run' AND e.held IS NOT TRUE THEN now() END,
            CASE WHEN v.verdict = 'run' AND e.held THEN now() ELSE t.held_due END,
            CASE WHEN v.verdict = 'skip' THEN jsonb_build_object('retryable', false, 'code', '` + api.CodeSkipped + `',
                'message', CASE WHEN t.dep_rule = 'any_succeeded' THEN 'no dependency succeeded'
                    ELSE format('dependency %s did not succeed', e.bad) END) ELSE t.error END,
            CASE WHEN v.verdict = 'skip' THEN now() END,
            coalesce(g.lease, t.lease),
            CASE WHEN g.lease IS NULL THEN t.node ELSE $2 END,
            t.attempt + CASE WHEN g.lease IS NULL THEN 0 ELSE 1 END,
            CASE WHEN g.lease IS NULL THEN t.executed_at ELSE statement_timestamp() END,
            CASE WHEN g.lease IS NULL THEN t.lost_not_before
                ELSE statement_timestamp() + g.lease_us * interval '1 microsecond' END,
            t.waiting_children AND g.lease IS NULL,
            CASE WHEN g.lease IS NULL THEN t.resubmitted ELSE t.resubmit END,
            t.resubmit AND g.lease IS NULL,
            now()
        FROM (SELECT c.*, CASE
                WHEN t.dep_rule IN ('all_ended', 'finally') THEN CASE WHEN pending <= 0 THEN 'run' END
                WHEN t.dep_rule = 'any_succeeded' THEN CASE WHEN ok > 0 THEN 'run' WHEN pending <= 0 THEN 'skip' END
                WHEN t.dep_rule = 'none_failed' THEN CASE WHEN failed > 0 THEN 'skip' WHEN pending <= 0 THEN 'run' END
                ELSE CASE WHEN failed + skipped > 0 THEN 'skip' WHEN pending <= 0 THEN 'run' END
            END AS verdict
            FROM (SELECT t.deps_pending - e.n AS pending, t.deps_succeeded + e.ok AS ok, t.deps_failed + e.failed AS failed,
                t.deps_skipped + e.skipped AS skipped) c) v
        LEFT JOIN LATERAL (
            SELECT g.lease, g.lease_us FROM cfg g
            WHERE g.behavior = t.behavior AND v.verdict = 'run' AND e.held IS NOT TRUE AND t.rate_uses IS NULL
              AND (g.first IS NULL OR g.first > t.priority)
              AND t.behavior NOT IN (SELECT behavior FROM paused)
              AND (t.group_key IS NULL OR (t.group_key NOT IN (SELECT group_key FROM held)
                  AND NOT EXISTS (SELECT 1 FROM stint_hold h WHERE h.group_key = t.group_key)))) g ON true)
    FROM ended e
    WHERE t.id = ANY(ARRAY[e.task_id]) AND t.status = 'waiting'
    RETURNING t.id, t.behavior, t.priority, t.schedule_not_before, t.group_key, t.status, t.parent_id, t.awaited,
        CASE t.status WHEN 'waiting' THEN NULL WHEN 'failure' THEN 'skip' ELSE 'run' END AS verdict,
        CASE WHEN t.status = 'running' THEN t.lease END AS started,
        CASE WHEN t.status = 'running' THEN (SELECT g.lease_us FROM cfg g WHERE g.behavior = t.behavior) END AS lease_us,
        t.attempt, t.errors, t.resubmitted,
        CASE WHEN t.status = 'running' THEN t.params END AS params,
        CASE WHEN t.status = 'running' THEN t.progress END AS progress,
        CASE WHEN t.status = 'running' THEN t.trace END AS trace
), due AS (` + dueInsert("u") + `
), leases AS (
    INSERT INTO stint_lease (lease, node, expires_at, task_ids, task_count, behavior)
    SELECT started, $2, statement_timestamp() + max(lease_us) * interval '1 microsecond', array_agg(id), count(*), min(behavior)
    FROM u WHERE started IS NOT NULL GROUP BY started
), feed AS (` + feedInsert(`(SELECT u.id, u.behavior, u.parent_id, e.status, u.verdict
    FROM u, LATERAL (VALUES (1, 'scheduled'), (2, u.status)) AS e(n, status)
    WHERE u.verdict IS NOT NULL AND (e.n = 2 OR u.started IS NOT NULL)) x`, "status", "verdict = 'skip'") + `
), notified AS (
    SELECT count(pg_notify('` + store.ChannelFinished + `', id)) AS n FROM u WHERE verdict = 'skip' AND awaited
), woke AS (
    SELECT count(pg_notify('` + store.ChannelDue + `', '')) AS n FROM (SELECT 1 FROM u WHERE status = 'scheduled' LIMIT 1) d
)
SELECT ARRAY(SELECT id FROM u WHERE verdict = 'skip'), ARRAY(SELECT parent_id FROM u WHERE verdict = 'skip' AND parent_id IS NOT NULL),
    (SELECT json_agg(json_build_object('id', id, 'lease', started, 'lease_us', lease_us, 'behavior', behavior,
        'params', params, 'progress', progress, 'attempt', attempt, 'errors', errors, 'priority', priority, 'parent', parent_id,
        'group_key', group_key, 'trace', trace, 'resubmitted', resubmitted)) FROM u WHERE started IS NOT NULL)
FROM notified, woke`

// nodesEnded records in the transaction q that tasks ended for good, in
// rounds of one round trip each. A round counts the tasks off their
// parents (childrenEndedSQL: parents holds each task's parent; none when
// empty), then wakes or skips the dependents of the workflow nodes ids,
// and of the nodes others whose workflow grew at run time (depsEndedSQL):
// that statement starts once the workflows' rows are locked, so it sees
// the edges a growth committed meanwhile, which a probe of the edges made
// before could not. The nodes it skips end in the next round, until none
// is. The dependents that run start on st's node, as many as st has room
// for (none when st is nil or ids is empty), as depsEndedSQL says; they
// are returned, and st learns of them from the caller once the
// transaction committed. With commit, the first round's round trip also
// commits the transaction: only when no task of ids failed, since a
// success skips no dependent and no round follows.
func nodesEnded(ctx context.Context, q batcher, parents, ids, others []string, st *starts, commit bool) ([]store.Claimed, error) {
	var started []store.Claimed
	for first := true; len(parents)+len(ids)+len(others) > 0 || first && commit; first = false {
		b := &pgx.Batch{}
		b.Queue(probesSaveOffSQL)
		if len(parents) > 0 {
			b.Queue(childrenEndedSQL, textArray(parents))
		}
		var raw []byte
		skipped, skippedParents := []string(nil), []string(nil)
		if len(ids)+len(others) > 0 {
			node, behaviors, leases, limit := "", []string{}, []int64{}, 0
			if st != nil && len(ids) > 0 {
				node, behaviors, leases, limit = st.Node, st.behaviors, st.leases, st.room()-len(started)
			}
			b.Queue(depsEndedSQL, textArray(ids), node, behaviors, leases, max(limit, 0), textArray(others)).QueryRow(func(r pgx.Row) error {
				return r.Scan(&skipped, &skippedParents, &raw)
			})
		}
		b.Queue(probesRestoreSQL)
		if first && commit {
			b.Queue("COMMIT")
		}
		if err := q.SendBatch(ctx, b).Close(); err != nil {
			return nil, fmt.Errorf("wake dependents: %w", err)
		}
		if raw != nil {
			var err error
			if started, err = appendStarted(started, raw); err != nil {
				return nil, fmt.Errorf("wake dependents: %w", err)
			}
		}
		if first && commit {
			if len(skipped) > 0 {
				return nil, fmt.Errorf("wake dependents: a success skipped %d of them", len(skipped))
			}
			return started, nil
		}
		parents, ids, others = skippedParents, skipped, nil
	}
	return started, nil
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
	b.Queue(`SELECT task_id, depends_on FROM stint_dependency WHERE task_id >= $1 AND task_id < $2 ORDER BY task_id, depends_on`,
		string(id)+"/", string(id)+"0")
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
// it and its finish changes nothing.
var cancelWorkflowSQL = `
WITH u AS (
    UPDATE stint_task t SET status = 'failure', schedule_not_before = NULL, lost_not_before = NULL, finished_at = now(),
        updated_at = now(), resubmit = false,
        error = jsonb_build_object('retryable', false, 'code', '` + api.CodeCancelled + `', 'message', 'the workflow was cancelled')
    WHERE t.parent_id = $1 AND t.workflow_node IS NOT NULL
      AND (t.status IN ('waiting', 'scheduled', 'held', 'running') OR t.schedule_not_before IS NOT NULL)
    RETURNING t.id, t.behavior, t.status, t.parent_id, t.awaited
), feed AS (` + feedInsert("u", "status", "true") + `
), notified AS (
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
			return nil
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

// retryWorkflowSQL runs the failed nodes of workflow $1 again (those that
// failed, were skipped or were cancelled), and its finally node, which
// runs after every other node: keeping the results of the nodes that
// succeeded, each waits again for its dependencies that run again,
// or is due at once when none does. The workflow's task waits for them,
// whatever its state: a run of it that records the old outcome is fenced
// out, as its task no longer runs.
var retryWorkflowSQL = `
WITH f AS MATERIALIZED (
    SELECT id FROM stint_task WHERE parent_id = $1 AND workflow_node IS NOT NULL AND status = 'failure'
), r AS MATERIALIZED (
    SELECT id FROM f
    UNION ALL
    SELECT id FROM stint_task WHERE parent_id = $1 AND dep_rule = 'finally' AND status = 'success' AND EXISTS (SELECT 1 FROM f)
), counts AS (
    SELECT e.task_id,
        count(*) FILTER (WHERE d.id IN (SELECT id FROM r)) AS pending,
        count(*) FILTER (WHERE d.status = 'success') AS ok
    FROM stint_dependency e JOIN stint_task d ON d.id = e.depends_on
    WHERE e.task_id IN (SELECT id FROM r)
    GROUP BY e.task_id
), u AS (
    UPDATE stint_task t SET
        status = CASE WHEN coalesce(c.pending, 0) = 0 THEN 'scheduled' ELSE 'waiting' END,
        schedule_not_before = CASE WHEN coalesce(c.pending, 0) = 0 THEN now() END,
        deps_pending = coalesce(c.pending, 0), deps_succeeded = coalesce(c.ok, 0), deps_failed = 0, deps_skipped = 0,
        attempt = 0, errors = 0, executed_at = NULL, finished_at = NULL, resubmit = false, updated_at = now()
    FROM r LEFT JOIN counts c ON c.task_id = r.id
    WHERE t.id = r.id
    RETURNING t.id, t.behavior, t.priority, t.schedule_not_before, t.group_key, t.status, t.parent_id
), w AS (
    UPDATE stint_task t SET status = 'waiting', schedule_not_before = NULL, lost_not_before = NULL, waiting_children = true,
        children_pending = (SELECT count(*) FROM r), attempt = 0, errors = 0, executed_at = NULL, finished_at = NULL,
        updated_at = now()
    WHERE t.id = $1
    RETURNING t.id, t.behavior, t.status, t.parent_id
), due AS (` + dueInsert("u") + `
), feed AS (` + feedInsert("(SELECT id, behavior, status, parent_id FROM u UNION ALL SELECT * FROM w) x", "status", "false") + `
), woke AS (
    SELECT count(pg_notify('` + store.ChannelDue + `', '')) AS n FROM (SELECT 1 FROM u WHERE status = 'scheduled' LIMIT 1) d
)
SELECT count(*) FROM u, woke`

// RetryWorkflow runs a failed or cancelled workflow again; see
// store.Workflows.
func (s *Store) RetryWorkflow(ctx context.Context, id api.TaskID) (int, error) {
	var n int
	err := retryDeadlock(ctx, s.pool, func(tx pgx.Tx) error {
		var behavior string
		var ended bool
		err := tx.QueryRow(ctx, `SELECT behavior, NOT EXISTS (SELECT 1 FROM stint_task n
			    WHERE n.parent_id = $1 AND n.workflow_node IS NOT NULL
			      AND NOT (n.status IN ('success', 'failure') AND n.schedule_not_before IS NULL))
			FROM stint_task WHERE id = $1 FOR UPDATE`, string(id)).Scan(&behavior, &ended)
		switch {
		case isNoRows(err) || err == nil && behavior != string(api.WorkflowBehavior):
			return api.ErrNotFound
		case err != nil:
			return err
		case !ended:
			return fmt.Errorf("workflow %s has nodes that have not ended: %w", id, api.ErrConflict)
		}
		if err := tx.QueryRow(ctx, retryWorkflowSQL, string(id)).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("workflow %s has no failed node to run again: %w", id, api.ErrConflict)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("retry workflow %s: %w", id, err)
	}
	return n, nil
}
