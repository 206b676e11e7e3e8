package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// workflowSubmitSQL stores workflows, all in one statement: each one's own
// task, waiting with no due time for its nodes to end (children_pending,
// which childrenEndedSQL counts down and which makes it due once it
// reaches zero), its nodes and its edges. A workflow whose id holds a task
// already stores nothing: its task's insert does nothing, and its nodes
// and edges are left out by their workflow's id (a node's id is its
// workflow's, a slash and its name; a workflow's id has no slash). A node
// without dependencies is scheduled, due after its delay; the others wait
// for theirs. It adds the claim hints of the scheduled nodes, records the
// workflows and their nodes in one row of the change feed, wakes the
// claimers, and returns the ids of the workflows it stored.
//
// The workflows' arrays ($1-$7) hold a row per workflow; the nodes'
// ($8-$21, $24) a row per node, with its workflow's position in $1 and,
// for a node of one dependency, that dependency's id (see singleDepsOpen;
// empty for the others); the edges' ($22-$23) a row per other edge, as
// the nodes' ids. A node's column that every node leaves at its zero
// value is sent empty (see omitZeros): the unnest reads NULL past an
// array's end, which the statement takes as that zero value.
var workflowSubmitSQL = `
WITH w AS (
    INSERT INTO stint_task AS t (id, behavior, params, priority, status, schedule_not_before, trace, awaited, retention_us,
        waiting_children, children_pending, deps_pending)
    SELECT r.id, '` + string(api.WorkflowBehavior) + `', r.params::jsonb, r.priority, 'waiting', NULL, nullif(r.trace, ''), r.awaited,
        nullif(r.retention_us, 0), true, r.nodes, 0
    FROM ` + unnestRows("r", "id $1::text[]", "params $2::text[]", "priority $3::smallint[]", "trace $4::text[]",
	"awaited $5::bool[]", "retention_us $6::bigint[]", "nodes $7::int[]") + `
    ON CONFLICT (id) DO NOTHING
    RETURNING t.id, t.behavior, t.status, t.parent_id
), created AS (
    SELECT jsonb_object_agg(id, true) AS ids FROM w
), s AS (
    INSERT INTO stint_task AS t (id, behavior, params, priority, status, schedule_not_before, group_key, parent_id, trace,
        awaited, retention_us, rate_uses, workflow_node, dep_rule, deps_pending, deps_succeeded, deps_failed, deps_skipped,
        version, depends_on)
    SELECT r.parent || '/' || r.name, r.behavior, r.params::jsonb, r.priority,
        CASE WHEN r.pending = 0 THEN 'scheduled' ELSE 'waiting' END,
        CASE WHEN r.pending = 0 THEN now() + coalesce(r.delay_us, 0) * interval '1 microsecond' END,
        nullif(r.group_key, ''), r.parent, nullif(r.trace, ''), coalesce(r.awaited, false), nullif(r.retention_us, 0),
        nullif(r.rate_uses, '')::jsonb, r.name, r.rule, r.pending, 0, 0, 0, nullif(r.version, 0), nullif(r.dep, '')
    FROM (SELECT ($1::text[])[r.of] AS parent, r.* FROM ` + unnestRows("r", "of $8::int[]", "name $9::text[]", "behavior $10::text[]", "params $11::text[]",
	"priority $12::smallint[]", "delay_us $13::bigint[]", "group_key $14::text[]", "trace $15::text[]", "awaited $16::bool[]",
	"retention_us $17::bigint[]", "rate_uses $18::text[]", "rule $19::text[]", "pending $20::int[]", "version $21::int[]",
	"dep $24::text[]") + `) r
    WHERE (SELECT ids FROM created) ? r.parent
    RETURNING t.id, t.behavior, t.priority, t.schedule_not_before, t.group_key, t.status, t.parent_id
), edges AS (
    INSERT INTO stint_dependency (depends_on, task_id)
    SELECT e.depends_on, e.task_id FROM ` + unnestRows("e", "depends_on $22::text[]", "task_id $23::text[]") + `
    WHERE (SELECT ids FROM created) ? split_part(e.task_id, '/', 1)
), due AS (` + dueInsert("s") + `
), feed AS (` + feedInsert("(SELECT id, behavior, status, parent_id FROM w UNION ALL SELECT id, behavior, status, parent_id FROM s) x",
	"status", "false") + `
), wake AS (
    SELECT pg_notify('` + store.ChannelDue + `', '') FROM (SELECT 1 FROM s WHERE status = 'scheduled' LIMIT 1) d
)
SELECT ARRAY(SELECT id FROM w), (SELECT count(*) FROM wake)`

// workflowNodesSQL stores workflow nodes that a running node adds to its
// workflow, each as its verdict says: run
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

// workflowEdgesSQL stores the edges of the nodes a running node adds.
var workflowEdgesSQL = `INSERT INTO stint_dependency (depends_on, task_id) SELECT * FROM ` +
	unnestRows("e", "depends_on $1::text[]", "task_id $2::text[]")

// workflowsTakenSQL reads the behaviors of the tasks that hold the ids of
// workflows workflowSubmitSQL did not store.
const workflowsTakenSQL = `SELECT id, behavior FROM stint_task WHERE id = ANY($1::text[])`

// SubmitWorkflow stores a workflow; see store.Workflows.
func (s *Store) SubmitWorkflow(ctx context.Context, tx pgx.Tx, wf store.NewWorkflow) (created bool, err error) {
	out, err := s.SubmitWorkflows(ctx, tx, []store.NewWorkflow{wf})
	if err != nil {
		return false, err
	}
	return out[0].Created, out[0].Err
}

// SubmitWorkflows stores workflows; see store.Workflows. They go out in
// one statement (workflowSubmitSQL): on the pool, in one round trip with
// its settings, as one implicit transaction; in tx, in a savepoint, so
// that a failure leaves the caller's transaction usable. A statement the
// database refuses for what its rows hold (a node's id taken by another
// task, a deadlock with another submit) is sent again in halves, each on
// its own, down to the one workflow at fault, which gets the error alone.
func (s *Store) SubmitWorkflows(ctx context.Context, tx pgx.Tx, wfs []store.NewWorkflow) ([]store.WorkflowOutcome, error) {
	out := make([]store.WorkflowOutcome, len(wfs))
	if err := s.submitWorkflows(ctx, tx, wfs, out); err != nil {
		if len(wfs) == 1 {
			return nil, fmt.Errorf("submit workflow %s: %w", wfs[0].Task.ID, err)
		}
		return nil, fmt.Errorf("submit %d workflows: %w", len(wfs), err)
	}
	return out, nil
}

// submitWorkflows stores wfs and gives each its outcome in out, halving
// wfs when the database refuses the statement for its rows; see
// SubmitWorkflows. It returns the error of a statement the database did
// not serve, when nothing of wfs was stored.
func (s *Store) submitWorkflows(ctx context.Context, tx pgx.Tx, wfs []store.NewWorkflow, out []store.WorkflowOutcome) error {
	err := s.submitWorkflowsOnce(ctx, tx, wfs, out)
	switch {
	case err == nil || !rowsRefused(err):
		return err
	case len(wfs) == 1:
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			err = api.Invalid("nodes", "a node's task id is taken by another task: %s", pgErr.Detail)
		}
		out[0].Err = fmt.Errorf("submit workflow %s: %w", wfs[0].Task.ID, err)
		return nil
	}
	half := len(wfs) / 2
	for _, part := range [][2]int{{0, half}, {half, len(wfs)}} {
		ws, outs := wfs[part[0]:part[1]], out[part[0]:part[1]]
		if err := s.submitWorkflows(ctx, tx, ws, outs); err != nil {
			for i := range outs {
				outs[i].Err = fmt.Errorf("submit workflow %s: %w", ws[i].Task.ID, err)
			}
		}
	}
	return nil
}

// rowsRefused reports whether err is the database refusing a statement
// for what its rows hold (a constraint, bad data, a deadlock), which a
// statement without some of them may not meet, rather than failing to
// serve it.
func rowsRefused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23") || pgErr.Code == "40P01"
}

// submitWorkflowsOnce stores wfs in one statement and, once it committed
// (or in tx), reads what holds the ids of those it did not store: the
// workflow itself (Created false), or another task (api.ErrConflict). An
// id whose task went away in between is submitted again.
func (s *Store) submitWorkflowsOnce(ctx context.Context, tx pgx.Tx, wfs []store.NewWorkflow, out []store.WorkflowOutcome) error {
	var db batcher = s.pool
	if tx != nil {
		sp, err := tx.Begin(ctx) // a savepoint
		if err != nil {
			return err
		}
		defer sp.Rollback(ctx) //nolint:errcheck // released below on success
		db = sp
	}
	var created []string
	args := workflowSubmitArgs(wfs, s.singleDepsOpen(ctx))
	if err := indexedRowWith(ctx, db, genericSettingsSQL, workflowSubmitSQL, args...).Scan(&created, new(int64)); err != nil {
		return err
	}
	made := make(map[api.TaskID]bool, len(created))
	for _, id := range created {
		made[api.TaskID(id)] = true
	}
	var taken []string
	for i, wf := range wfs {
		out[i] = store.WorkflowOutcome{Created: made[wf.Task.ID]}
		if !out[i].Created {
			taken = append(taken, string(wf.Task.ID))
		}
	}
	var again []int
	if len(taken) > 0 {
		// The id is taken: by this workflow (a second submit stores
		// nothing) or by a task that is not a workflow.
		behaviors := map[api.TaskID]string{}
		if _, err := indexed(ctx, db, func(rows pgx.Rows) error {
			var id, behavior string
			_, err := pgx.ForEachRow(rows, []any{&id, &behavior}, func() error {
				behaviors[api.TaskID(id)] = behavior
				return nil
			})
			return err
		}, workflowsTakenSQL, textArray(taken)); err != nil {
			return err
		}
		for i, wf := range wfs {
			if out[i].Created {
				continue
			}
			switch b, ok := behaviors[wf.Task.ID]; {
			case !ok:
				again = append(again, i)
			case b != string(api.WorkflowBehavior):
				out[i].Err = fmt.Errorf("submit workflow %s: task %s is of behavior %s, not a workflow: %w", wf.Task.ID, wf.Task.ID, b, api.ErrConflict)
			}
		}
	}
	if tx != nil {
		if err := db.(pgx.Tx).Commit(ctx); err != nil { // releases the savepoint
			return err
		}
	}
	for _, i := range again {
		// Removed since the statement found it: submitted again.
		if err := s.submitWorkflows(ctx, tx, wfs[i:i+1], out[i:i+1]); err != nil {
			return err
		}
	}
	return nil
}

// workflowSubmitArgs returns the parameters of workflowSubmitSQL for wfs,
// in the order of their ids, so that submits of the same ids take their
// rows' locks in the same order. With single, a node of one dependency
// keeps it in its column rather than in an edge row.
func workflowSubmitArgs(wfs []store.NewWorkflow, single bool) []any {
	order := make([]int, len(wfs))
	nodes, edges := 0, 0
	for i, wf := range wfs {
		order[i] = i
		nodes += len(wf.Nodes)
		for _, d := range wf.DependsOn {
			edges += len(d)
		}
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(string(wfs[a].Task.ID), string(wfs[b].Task.ID)) })
	n := len(wfs)
	ids, params, traces := make(textArray, 0, n), make(textArray, 0, n), make(textArray, 0, n)
	priorities, retentions, counts := make(intArray, 0, n), make(intArray, 0, n), make(intArray, 0, n)
	awaited := make(boolArray, 0, n)
	of, names, behaviors, nparams := make(intArray, 0, nodes), make(textArray, 0, nodes), make(textArray, 0, nodes), make(textArray, 0, nodes)
	npriorities, delays, groups, ntraces := make(intArray, 0, nodes), make(intArray, 0, nodes), make(textArray, 0, nodes), make(textArray, 0, nodes)
	nawaited, nretentions, uses, rules := make(boolArray, 0, nodes), make(intArray, 0, nodes), make(textArray, 0, nodes), make(textArray, 0, nodes)
	pending, versions, oneDep := make(intArray, 0, nodes), make(intArray, 0, nodes), make(textArray, 0, nodes)
	from, to := make(textArray, 0, edges), make(textArray, 0, edges)
	for k, i := range order {
		wf := wfs[i]
		t := wf.Task
		ids, params, traces = append(ids, string(t.ID)), append(params, string(t.Params)), append(traces, t.Trace)
		priorities, retentions = append(priorities, int64(t.Priority)), append(retentions, t.Retention.Microseconds())
		counts, awaited = append(counts, int64(len(wf.Nodes))), append(awaited, t.Notify)
		for j, nt := range wf.Nodes {
			of, names = append(of, int64(k+1)), append(names, wf.Names[j])
			behaviors, nparams = append(behaviors, string(nt.Behavior)), append(nparams, string(nt.Params))
			npriorities, delays = append(npriorities, int64(nt.Priority)), append(delays, nt.Delay.Microseconds())
			groups, ntraces = append(groups, nt.GroupKey), append(ntraces, nt.Trace)
			nawaited, nretentions = append(nawaited, nt.Notify), append(nretentions, nt.Retention.Microseconds())
			use := ""
			if len(nt.RateUses) > 0 {
				b, _ := json.Marshal(nt.RateUses) // strings and numbers: cannot fail
				use = string(b)
			}
			uses, rules = append(uses, use), append(rules, string(wf.Rules[j]))
			pending, versions = append(pending, int64(len(wf.DependsOn[j]))), append(versions, int64(nt.Version))
			if deps := wf.DependsOn[j]; single && len(deps) == 1 {
				oneDep = append(oneDep, string(wf.Nodes[deps[0]].ID))
				continue
			}
			oneDep = append(oneDep, "")
			for _, d := range wf.DependsOn[j] {
				from, to = append(from, string(wf.Nodes[d].ID)), append(to, string(nt.ID))
			}
		}
	}
	return []any{ids, params, priorities, traces, awaited, retentions, counts,
		of, names, behaviors, nparams, npriorities, omitZeros(delays), omitZeros(groups), omitZeros(ntraces), omitZeros(nawaited),
		omitZeros(nretentions), omitZeros(uses), rules, pending, omitZeros(versions), from, to, omitZeros(oneDep)}
}

// omitZeros returns a emptied when each of its elements is the zero
// value: a column of a batch statement that most rows leave at its
// default is then not sent row by row.
func omitZeros[S ~[]E, E comparable](a S) S {
	var zero E
	for _, v := range a {
		if v != zero {
			return a
		}
	}
	return a[:0]
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
// parent index, and the workflow's edges by a range of node ids in
// stint_dependency's task index and in stint_task's primary key (a node's
// single dependency; node ids are the workflow's id, "/" and the node's
// name, and sort as bytes). A waiting node's dependencies not ended are found
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

// workflowEdgesOfSQL reads the edges of a workflow, the edge rows and the
// single dependencies, by the range [$1, $2) of its nodes' ids (see
// WorkflowNodes; OFFSET 0 as in dependenciesOf).
const workflowEdgesOfSQL = `SELECT task_id, depends_on FROM stint_dependency WHERE task_id >= $1 AND task_id < $2
UNION ALL
SELECT id, depends_on FROM (SELECT id, depends_on FROM stint_task WHERE id >= $1 AND id < $2 OFFSET 0) n
WHERE depends_on IS NOT NULL
ORDER BY 1, 2`

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
