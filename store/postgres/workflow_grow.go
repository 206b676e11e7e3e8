package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// A workflow grows from inside: a running node adds nodes to it. The
// growth's transaction locks the workflow's row before it reads the state
// of the nodes the new ones depend on. Every finish of a node counts its
// end off that row (childrenEndedSQL) before it wakes the node's
// dependents (depsEnded, a later statement that sees the edges committed
// meanwhile), so a dependency either ended before the growth read it, and
// the growth counts its outcome, or wakes the new node itself: never
// neither, never both.

// grownNode is an existing node of a growing workflow, as the growth reads
// it: its outcome so far and, for the nodes it adds dependencies to, its
// rule and counts.
type grownNode struct {
	id     string
	status string
	code   string
	rule   api.Rule
	state  nodeState
}

// outcome is the node's outcome as a dependency: "success", "failed",
// "skipped", or "" while it has not ended.
func (n grownNode) outcome() string {
	switch {
	case n.status == string(api.StatusSuccess):
		return "success"
	case n.status != string(api.StatusFailure):
		return ""
	case n.code == api.CodeSkipped:
		return "skipped"
	}
	return "failed"
}

// decide is depsEndedSQL's verdict on a node of rule with the counts st:
// "run", "skip" or "" (it waits on). bad names a dependency that did not
// succeed, for a skip's message.
func decide(rule api.Rule, st nodeState, bad string) (verdict, why string) {
	skip := func() (string, string) {
		if rule == api.RuleAnySucceeded {
			return "skip", "no dependency succeeded"
		}
		return "skip", "dependency " + bad + " did not succeed"
	}
	switch rule {
	case api.RuleAllEnded, store.RuleFinally:
	case api.RuleAnySucceeded:
		if st.ok > 0 {
			return "run", ""
		}
		if st.pending <= 0 {
			return skip()
		}
	case api.RuleNoneFailed:
		if st.failed > 0 {
			return skip()
		}
	default:
		if st.failed+st.skipped > 0 {
			return skip()
		}
	}
	if st.pending <= 0 {
		return "run", ""
	}
	return "", ""
}

// count adds a dependency's outcome to st.
func (st *nodeState) count(outcome string) {
	switch outcome {
	case "success":
		st.ok++
	case "failed":
		st.failed++
	case "skipped":
		st.skipped++
	default:
		st.pending++
	}
}

// grownNodesSQL reads nodes of workflow $2 by id, a node that failed and
// will run again (a retry) as scheduled; grownNodesLockSQL also locks
// them, for the nodes whose counts the growth changes.
const (
	grownNodesSQL = `SELECT id, workflow_node, CASE WHEN schedule_not_before IS NULL THEN status ELSE 'scheduled' END,
	    coalesce(error->>'code', ''), coalesce(dep_rule, ''),
	    coalesce(deps_pending, 0), coalesce(deps_succeeded, 0), coalesce(deps_failed, 0), coalesce(deps_skipped, 0)
	FROM stint_task WHERE id = ANY($1::text[]) AND parent_id = $2`
	grownNodesLockSQL = grownNodesSQL + ` FOR UPDATE`
)

// ancestorEdgesSQL returns the edges (dependent, dependency) of the nodes
// $1 and of all they depend on, transitively, each node's found by probes
// of the indexes that hold them (see dependenciesOf).
var ancestorEdgesSQL = `
WITH RECURSIVE up(id) AS (
    SELECT unnest($1::text[]) COLLATE "C"
    UNION
    SELECT e.depends_on FROM up, LATERAL (` + dependenciesOf("up.id") + `) e
)
SELECT up.id, e.depends_on FROM up, LATERAL (` + dependenciesOf("up.id") + `) e`

// gatedNodesSQL stores the new counts of existing nodes that got new
// dependencies, and their verdict: a node that must now wait is waiting
// (its claim hint no longer matches it), one a skipped new node decides is
// skipped. It records those whose status changed ($8) in the change feed.
var gatedNodesSQL = `
WITH u AS (
    UPDATE stint_task t SET deps_pending = g.pending, deps_succeeded = g.ok, deps_failed = g.failed, deps_skipped = g.skipped,
        status = CASE g.verdict WHEN 'skip' THEN 'failure' WHEN 'run' THEN t.status ELSE 'waiting' END,
        schedule_not_before = CASE WHEN g.verdict = 'run' THEN t.schedule_not_before END,
        held_due = CASE WHEN g.verdict = 'run' THEN t.held_due END,
        error = CASE WHEN g.verdict = 'skip' THEN jsonb_build_object('retryable', false, 'code', '` + api.CodeSkipped + `',
            'message', g.why) ELSE t.error END,
        finished_at = CASE WHEN g.verdict = 'skip' THEN now() END,
        updated_at = now()
    FROM ` + unnestRows("g", "id $1::text[]", "pending $2::bigint[]", "ok $3::bigint[]", "failed $4::bigint[]",
	"skipped $5::bigint[]", "verdict $6::text[]", "why $7::text[]", "changed $8::bool[]") + `
    WHERE t.id = g.id
    RETURNING t.id, t.behavior, t.status, t.parent_id, g.changed
), feed AS (` + feedInsert("(SELECT * FROM u WHERE changed) c", "status", "status = 'failure'") + `)
SELECT count(*) FROM u`

// GrowWorkflow adds nodes to a running node's workflow; see
// store.Workflows.
func (s *Store) GrowWorkflow(ctx context.Context, tx pgx.Tx, holder store.LeaseRef, workflow api.TaskID, add store.NewNodes) error {
	var db interface {
		Begin(context.Context) (pgx.Tx, error)
	} = s.pool
	if tx != nil {
		db = tx // a savepoint: a failure leaves the caller's transaction usable
	}
	err := retryDeadlock(ctx, db, func(tx pgx.Tx) error { return growWorkflow(ctx, tx, holder, workflow, add) })
	if err != nil {
		return fmt.Errorf("add nodes to workflow %s: %w", workflow, err)
	}
	return nil
}

func growWorkflow(ctx context.Context, tx pgx.Tx, holder store.LeaseRef, workflow api.TaskID, add store.NewNodes) error {
	var behavior, status string
	var params []byte
	err := tx.QueryRow(ctx, `SELECT behavior, status, params FROM stint_task WHERE id = $1 FOR UPDATE`, string(workflow)).Scan(&behavior, &status, &params)
	if isNoRows(err) {
		return api.ErrHalt // removed, with its nodes
	}
	if err != nil {
		return err
	}
	if behavior != string(api.WorkflowBehavior) {
		return api.Invalid("nodes", "task %s is no workflow node", holder.ID)
	}
	var one int
	err = tx.QueryRow(ctx, `SELECT 1 FROM stint_task WHERE id = $1 AND lease = $2 AND status = 'running' AND parent_id = $3 FOR UPDATE`,
		string(holder.ID), uuid(holder.Lease), string(workflow)).Scan(&one)
	if isNoRows(err) {
		return api.ErrHalt
	}
	if err != nil {
		return err
	}
	var wp struct {
		Finally string `json:"finally"`
	}
	if err := json.Unmarshal(params, &wp); err != nil {
		return fmt.Errorf("read workflow params: %w", err)
	}
	prefix := string(workflow) + "/"
	if strings.TrimPrefix(string(holder.ID), prefix) == wp.Finally {
		return api.Invalid("nodes", "node %q is the finally node: it runs last and adds no nodes", wp.Finally)
	}
	// The workflow's row lock keeps other growths from adding nodes
	// between this count and the insert.
	var nodes int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM stint_task WHERE parent_id = $1`, string(workflow)).Scan(&nodes); err != nil {
		return fmt.Errorf("count the workflow's nodes: %w", err)
	}
	if nodes+len(add.Nodes) > api.MaxWorkflowNodes {
		return api.Invalid("nodes", "adding %d nodes to the workflow's %d makes %d, over the limit of %d",
			len(add.Nodes), nodes, nodes+len(add.Nodes), api.MaxWorkflowNodes)
	}

	// The existing nodes named: as dependencies (read), and as nodes that
	// get new dependencies, with the finally node (locked); the new names
	// must be free.
	isNew := make(map[string]int, len(add.Names))
	probe := make(textArray, 0, len(add.Names))
	for i, name := range add.Names {
		isNew[name] = i
		probe = append(probe, prefix+name)
	}
	var depIDs textArray
	for _, deps := range add.DependsOn {
		for _, d := range deps {
			if _, ok := isNew[d]; !ok && !slices.Contains(depIDs, prefix+d) {
				depIDs = append(depIDs, prefix+d)
			}
		}
	}
	existing, err := readGrown(ctx, tx, grownNodesSQL, append(probe, depIDs...), workflow)
	if err != nil {
		return err
	}
	for _, name := range add.Names {
		if _, taken := existing[name]; taken {
			return api.Invalid("nodes", "node %q exists in the workflow", name)
		}
	}
	for i, deps := range add.DependsOn {
		for _, d := range deps {
			_, known := existing[d]
			_, fresh := isNew[d]
			switch {
			case d == wp.Finally && wp.Finally != "":
				return api.Invalid("nodes", "node %q depends on %q, the finally node, which runs last", add.Names[i], d)
			case !known && !fresh:
				return api.Invalid("nodes", "node %q depends on %q, which is not a node of the workflow", add.Names[i], d)
			}
		}
	}
	gatedNames := make([]string, 0, len(add.AddDependencies))
	for name := range add.AddDependencies {
		gatedNames = append(gatedNames, name)
	}
	slices.Sort(gatedNames) // lock in one order
	locked := make(textArray, 0, len(gatedNames)+1)
	for _, name := range gatedNames {
		if name == wp.Finally {
			return api.Invalid("add_dependencies", "node %q is the finally node: it waits for the new nodes anyway", name)
		}
		locked = append(locked, prefix+name)
	}
	if wp.Finally != "" {
		locked = append(locked, prefix+wp.Finally)
	}
	gated, err := readGrown(ctx, tx, grownNodesLockSQL, locked, workflow)
	if err != nil {
		return err
	}
	for _, name := range gatedNames {
		g, ok := gated[name]
		switch {
		case !ok:
			return api.Invalid("add_dependencies", "%q is not a node of the workflow", name)
		case g.status != "waiting" && g.status != string(api.StatusScheduled) && g.status != string(api.StatusHeld):
			return fmt.Errorf("node %q cannot wait for new nodes: it is %s: %w", name, g.status, api.ErrConflict)
		}
	}
	if cycle, err := growthCycle(ctx, tx, add, gatedNames, depIDs, prefix); err != nil || cycle != nil {
		if err != nil {
			return err
		}
		return api.Invalid("nodes", "the dependencies would form a cycle: %s", strings.Join(cycle, " -> "))
	}

	// Decide the new nodes in dependency order: one whose dependencies
	// already decided it is stored scheduled or skipped.
	states := make([]nodeState, len(add.Nodes))
	done := make([]bool, len(add.Nodes))
	for left := len(add.Nodes); left > 0; {
		for i, deps := range add.DependsOn {
			if done[i] || slices.ContainsFunc(deps, func(d string) bool { j, ok := isNew[d]; return ok && !done[j] }) {
				continue
			}
			bad := ""
			for _, d := range deps {
				out := newOutcome(d, isNew, states, existing)
				states[i].count(out)
				if out != "success" && out != "" && (bad == "" || d < bad) {
					bad = d
				}
			}
			states[i].verdict, states[i].why = decide(add.Rules[i], states[i], bad)
			done[i], left = true, left-1
		}
	}
	if err := insertGrown(ctx, tx, workflow, add, states, wp.Finally, status == string(api.StatusHeld)); err != nil {
		return err
	}

	// The existing nodes that wait for new ones, and the finally node.
	var ids, verdicts, whys textArray
	var pending, ok, failed, skipped intArray
	var changed boolArray
	var ended []string
	for _, name := range append(gatedNames, wp.Finally) {
		g, found := gated[name]
		if !found {
			continue
		}
		news := add.AddDependencies[name]
		if name == wp.Finally {
			news = add.Names
		}
		st := g.state
		bad := ""
		for _, n := range news {
			out := newOutcome(n, isNew, states, existing)
			st.count(out)
			if out == "skipped" && (bad == "" || n < bad) {
				bad = n
			}
		}
		st.verdict, st.why = decide(g.rule, st, bad)
		if g.status == "waiting" && st.verdict == "run" {
			st.verdict = "" // it waited: new dependencies cannot make it due
		}
		if st.verdict == "skip" {
			ended = append(ended, g.id)
		}
		ids, verdicts, whys = append(ids, g.id), append(verdicts, st.verdict), append(whys, st.why)
		changed = append(changed, st.verdict == "skip" || st.verdict == "" && g.status != "waiting")
		pending, ok = append(pending, int64(st.pending)), append(ok, int64(st.ok))
		failed, skipped = append(failed, int64(st.failed)), append(skipped, int64(st.skipped))
	}
	if len(ids) > 0 {
		if _, err := tx.Exec(ctx, gatedNodesSQL, ids, pending, ok, failed, skipped, verdicts, whys, changed); err != nil {
			return fmt.Errorf("add dependencies: %w", err)
		}
	}

	// The workflow waits for its new nodes, marked grown: from now on,
	// its nodes' finishes wake their dependents whatever edges their own
	// statement saw (see finishBatch).
	if _, err := tx.Exec(ctx, `UPDATE stint_task SET children_pending = children_pending + $2, params = params || '{"grown": true}'
		WHERE id = $1`, string(workflow), len(add.Nodes)); err != nil {
		return err
	}
	// The nodes skipped at once count as ended. The dependents of the new
	// ones were all decided above; those of the existing ones they skipped
	// learn it from depsEnded.
	existingSkipped := slices.Clone(ended)
	for i, st := range states {
		if st.verdict == "skip" {
			ended = append(ended, string(add.Nodes[i].ID))
		}
	}
	if len(ended) == 0 {
		return nil
	}
	parents := make(textArray, len(ended))
	for i := range parents {
		parents[i] = string(workflow)
	}
	_, err = nodesEnded(ctx, tx, parents, existingSkipped, nil, nil, false)
	return err
}

// newOutcome is the outcome of dependency d of a new node: a new node's as
// decided (a skip, or not ended), an existing one's as read.
func newOutcome(d string, isNew map[string]int, states []nodeState, existing map[string]grownNode) string {
	if j, ok := isNew[d]; ok {
		if states[j].verdict == "skip" {
			return "skipped"
		}
		return ""
	}
	return existing[d].outcome()
}

// readGrown reads the nodes ids of workflow with query (grownNodesSQL or
// grownNodesLockSQL), by name.
func readGrown(ctx context.Context, tx pgx.Tx, query string, ids textArray, workflow api.TaskID) (map[string]grownNode, error) {
	out := map[string]grownNode{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := tx.Query(ctx, query, ids, string(workflow))
	if err != nil {
		return nil, fmt.Errorf("read nodes: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var n grownNode
		var name, rule string
		if err := rows.Scan(&n.id, &name, &n.status, &n.code, &rule, &n.state.pending, &n.state.ok, &n.state.failed, &n.state.skipped); err != nil {
			return nil, fmt.Errorf("read nodes: %w", err)
		}
		n.rule = api.Rule(rule)
		out[name] = n
	}
	return out, rows.Err()
}

// growthCycle returns the names along a cycle that the growth add would
// close, or nil. New nodes depend on new and existing ones; only an
// existing node that gets new dependencies (gated) can close a cycle, by
// being an ancestor of an existing dependency of a new node (depIDs, ids
// with prefix): so the graph checked is the new nodes, the gated ones and
// the ancestors of depIDs.
func growthCycle(ctx context.Context, tx pgx.Tx, add store.NewNodes, gated []string, depIDs textArray, prefix string) ([]string, error) {
	index := map[string]int{}
	var names []string
	node := func(name string) int {
		i, ok := index[name]
		if !ok {
			i = len(names)
			index[name] = i
			names = append(names, name)
		}
		return i
	}
	for _, name := range add.Names {
		node(name)
	}
	deps := map[int][]int{}
	for i, ds := range add.DependsOn {
		for _, d := range ds {
			deps[i] = append(deps[i], node(d))
		}
	}
	for _, g := range gated {
		gi := node(g)
		for _, n := range add.AddDependencies[g] {
			deps[gi] = append(deps[gi], node(n))
		}
	}
	if len(gated) > 0 && len(depIDs) > 0 {
		rows, err := tx.Query(ctx, ancestorEdgesSQL, depIDs)
		if err != nil {
			return nil, fmt.Errorf("read the workflow's edges: %w", err)
		}
		for rows.Next() {
			var task, dep string
			if err := rows.Scan(&task, &dep); err != nil {
				rows.Close()
				return nil, fmt.Errorf("read the workflow's edges: %w", err)
			}
			t := node(strings.TrimPrefix(task, prefix))
			deps[t] = append(deps[t], node(strings.TrimPrefix(dep, prefix)))
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("read the workflow's edges: %w", err)
		}
	}
	graph := make([][]int, len(names))
	for i, ds := range deps {
		graph[i] = ds
	}
	cycle := store.FindCycle(graph)
	if cycle == nil {
		return nil, nil
	}
	out := make([]string, len(cycle))
	for i, j := range cycle {
		out[i] = fmt.Sprintf("%q", names[j])
	}
	return out, nil
}

// insertGrown stores the new nodes of add as states decided, and the
// edges to them: from their dependencies, and to the existing nodes that
// wait for them, the finally node (named finally; empty for none) among
// them. held says whether the workflow is held.
func insertGrown(ctx context.Context, tx pgx.Tx, workflow api.TaskID, add store.NewNodes, states []nodeState, finally string, held bool) error {
	var n int
	if err := tx.QueryRow(ctx, workflowNodesSQL, workflowNodeArgs(workflow, add.Nodes, add.Names, add.Rules, states, held)...).Scan(&n); err != nil {
		return fmt.Errorf("store nodes: %w", err)
	}
	prefix := string(workflow) + "/"
	var from, to textArray
	for i, deps := range add.DependsOn {
		for _, d := range deps {
			from, to = append(from, prefix+d), append(to, string(add.Nodes[i].ID))
		}
	}
	for g, news := range add.AddDependencies {
		for _, name := range news {
			from, to = append(from, prefix+name), append(to, prefix+g)
		}
	}
	if finally != "" {
		for _, t := range add.Nodes {
			from, to = append(from, string(t.ID)), append(to, prefix+finally)
		}
	}
	if len(from) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, workflowEdgesSQL, from, to)
	return err
}
