package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// A retry runs failed nodes of a workflow again, with the nodes their
// failure ended: the failed, skipped and cancelled nodes that depend on
// them, directly or not, and the finally node; a node that its other
// dependencies rule out anyway keeps its outcome (see rerun). Every other
// node keeps its state. Each node that runs again counts its dependencies
// afresh (those that run again, or have not ended, are pending), and each
// node that still waits for a dependency that runs again forgets that
// dependency's outcome: every dependency's outcome is counted once by each
// dependent. A dependent that started, or was made ready, keeps its run.

// retryNode is a node as a retry reads it.
type retryNode struct {
	id, rule, status, code string
	// due says a failed or succeeded node waits to run again (a retry
	// after a retryable failure): it has not ended.
	due        bool
	deps, next []int // the nodes it depends on, and its dependents
}

// ended says the node ended for good; failed, that it failed for good
// (skipped and cancelled included).
func (n *retryNode) ended() bool  { return (n.status == "success" || n.status == "failure") && !n.due }
func (n *retryNode) failed() bool { return n.status == "failure" && !n.due }

// retryNodesSQL reads the nodes of workflow $1 for a retry.
const retryNodesSQL = `SELECT id, status, schedule_not_before IS NOT NULL, coalesce(error->>'code', ''), coalesce(dep_rule, '')
FROM stint_task WHERE parent_id = $1 AND workflow_node IS NOT NULL`

// retryRunSQL makes the nodes $1 wait again, with the counts $2 to $5 of
// their dependencies by outcome (pending, succeeded, failed, skipped): a
// node whose rule lets it run ($6) is due at once, or held when its
// workflow is ($7). It adds the claim hints and records the changes.
var retryRunSQL = `
WITH u AS (
    UPDATE stint_task t SET
        status = CASE WHEN NOT r.ready THEN 'waiting' WHEN $7 THEN 'held' ELSE 'scheduled' END,
        schedule_not_before = CASE WHEN r.ready AND NOT $7 THEN now() END,
        held_due = CASE WHEN r.ready AND $7 THEN now() END,
        deps_pending = r.pending, deps_succeeded = r.ok, deps_failed = r.failed, deps_skipped = r.skipped,
        attempt = 0, errors = 0, executed_at = NULL, finished_at = NULL, lost_not_before = NULL,
        resubmit = false, resubmit_due = NULL, updated_at = now()
    FROM ` + unnestRows("r", "id $1::text[]", "pending $2::int[]", "ok $3::int[]", "failed $4::int[]", "skipped $5::int[]",
	"ready $6::bool[]") + `
    WHERE t.id = r.id
    RETURNING t.id, t.behavior, t.priority, t.schedule_not_before, t.group_key, t.status, t.parent_id
), due AS (` + dueInsert("u") + `
), feed AS (` + feedInsert("u", "status", "false") + `
), woke AS (
    SELECT count(pg_notify('` + store.ChannelDue + `', '')) AS n FROM (SELECT 1 FROM u WHERE status = 'scheduled' LIMIT 1) d
)
SELECT count(*) FROM u, woke`

// retryForgetSQL makes the waiting nodes $1 forget outcomes of
// dependencies that run again: $2 more pending, $3 fewer failed, $4
// fewer skipped.
var retryForgetSQL = `
UPDATE stint_task t SET deps_pending = t.deps_pending + r.pending, deps_failed = t.deps_failed - r.failed,
    deps_skipped = t.deps_skipped - r.skipped, updated_at = now()
FROM ` + unnestRows("r", "id $1::text[]", "pending $2::int[]", "failed $3::int[]", "skipped $4::int[]") + `
WHERE t.id = r.id AND t.status = 'waiting'`

// retryWaitSQL makes workflow $1 wait for its $2 nodes that have not
// ended, held still when it is held: a run of it that records the old
// outcome is fenced out, as its task no longer runs.
var retryWaitSQL = `
WITH w AS (
    UPDATE stint_task SET status = CASE WHEN status = 'held' THEN 'held' ELSE 'waiting' END,
        schedule_not_before = NULL, lost_not_before = NULL, held_due = NULL,
        waiting_children = true, children_pending = $2, attempt = 0, errors = 0, executed_at = NULL, finished_at = NULL,
        updated_at = now()
    WHERE ` + isWorkflow + `
    RETURNING id, behavior, status, parent_id
), feed AS (` + feedInsert("w", "status", "false") + `)
SELECT count(*) FROM w`

// retryNodes runs nodes of workflow wf again in tx, which holds the
// workflow's row locked (held says whether it is held): with whole, every
// failed node of a workflow whose nodes all ended; else the node root
// (a failed or cancelled node, not a skipped one: its dependencies
// decided it). It returns how many nodes run again.
func retryNodes(ctx context.Context, tx pgx.Tx, wf api.TaskID, held, whole bool, root api.TaskID) (int, error) {
	nodes, at, err := readRetryNodes(ctx, tx, wf)
	if err != nil {
		return 0, err
	}
	var roots []int
	if whole {
		for i, n := range nodes {
			if !n.ended() {
				return 0, fmt.Errorf("workflow %s has nodes that have not ended: %w", wf, api.ErrConflict)
			}
			if n.failed() {
				roots = append(roots, i)
			}
		}
		if len(roots) == 0 {
			return 0, fmt.Errorf("workflow %s has no failed node to run again: %w", wf, api.ErrConflict)
		}
	} else {
		i, ok := at[string(root)]
		if !ok {
			return 0, api.ErrNotFound
		}
		n := nodes[i]
		switch {
		case !n.failed():
			return 0, fmt.Errorf("node %s has not failed for good (it is %s): %w", root, retryState(n), api.ErrConflict)
		case n.code == api.CodeSkipped:
			return 0, fmt.Errorf("node %s was skipped, as its dependencies' outcomes decided: retry the dependency that failed, or the workflow: %w",
				root, api.ErrConflict)
		}
		roots = []int{i}
	}
	again, counts, ready := rerun(nodes, roots)
	if !whole && !again.has(roots[0]) {
		return 0, fmt.Errorf("node %s cannot run: a dependency of it did not succeed; retry that one, or the workflow: %w",
			root, api.ErrConflict)
	}
	n := len(again.order)
	pending, ok, failed, skipped, ids := make(intArray, n), make(intArray, n), make(intArray, n), make(intArray, n), make(textArray, n)
	starts := make(boolArray, n)
	for k, i := range again.order {
		c := counts[i]
		ids[k], starts[k] = nodes[i].id, ready[i]
		pending[k], ok[k], failed[k], skipped[k] = int64(c.pending), int64(c.ok), int64(c.failed), int64(c.skipped)
	}
	// The waiting dependents of the nodes that run again forget their
	// outcomes.
	var fIDs textArray
	var fPending, fFailed, fSkipped intArray
	for i, n := range nodes {
		if n.status != "waiting" || again.has(i) {
			continue
		}
		var c depCounts
		for _, d := range n.deps {
			if again.has(d) {
				c.add(nodes[d], false)
			}
		}
		if c.ok+c.failed+c.skipped > 0 {
			fIDs = append(fIDs, n.id)
			fPending = append(fPending, int64(c.ok+c.failed+c.skipped))
			fFailed, fSkipped = append(fFailed, int64(c.failed)), append(fSkipped, int64(c.skipped))
		}
	}
	notEnded := n
	for i, n := range nodes {
		if !n.ended() && !again.has(i) {
			notEnded++
		}
	}
	b := &pgx.Batch{}
	b.Queue(retryRunSQL, ids, pending, ok, failed, skipped, starts, held)
	if len(fIDs) > 0 {
		b.Queue(retryForgetSQL, fIDs, fPending, fFailed, fSkipped)
	}
	b.Queue(retryWaitSQL, string(wf), notEnded)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, err
	}
	return n, nil
}

// retryState says what a node that has not failed for good is.
func retryState(n retryNode) string {
	if n.due {
		return "waiting for its next run"
	}
	return n.status
}

// readRetryNodes reads the nodes of workflow wf with their edges, and
// indexes them by id. A workflow that lost a node its other nodes depend
// on (it left once its own retention passed after the workflow ended)
// cannot run again: api.ErrConflict.
func readRetryNodes(ctx context.Context, tx pgx.Tx, wf api.TaskID) ([]retryNode, map[string]int, error) {
	rows, err := tx.Query(ctx, retryNodesSQL, string(wf))
	if err != nil {
		return nil, nil, err
	}
	var nodes []retryNode
	var n retryNode
	if _, err := pgx.ForEachRow(rows, []any{&n.id, &n.status, &n.due, &n.code, &n.rule}, func() error {
		nodes = append(nodes, n)
		return nil
	}); err != nil {
		return nil, nil, err
	}
	at := make(map[string]int, len(nodes))
	for i, n := range nodes {
		at[n.id] = i
	}
	rows, err = tx.Query(ctx, workflowEdgesOfSQL, string(wf)+"/", string(wf)+"0")
	if err != nil {
		return nil, nil, err
	}
	var task, dep, gone string
	if _, err := pgx.ForEachRow(rows, []any{&task, &dep}, func() error {
		i, ok := at[task]
		j, ok2 := at[dep]
		if ok && ok2 {
			nodes[i].deps = append(nodes[i].deps, j)
			nodes[j].next = append(nodes[j].next, i)
		} else if ok && gone == "" {
			gone = dep
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	if gone != "" {
		return nil, nil, fmt.Errorf("workflow %s cannot run again: its node %s left once its retention passed: %w", wf, gone, api.ErrConflict)
	}
	return nodes, at, nil
}

// nodeSet is a set of nodes by index, in the order they were added.
type nodeSet struct {
	order []int
	in    map[int]bool
}

func (s nodeSet) has(i int) bool { return s.in[i] }

// rerun returns the nodes that run again: roots, and the nodes their
// failure ended (the failed nodes that depend on them, directly or not,
// and the finally node once it ended), each with its counts of its
// dependencies and whether its rule lets it run at once. A candidate
// whose other dependencies' outcomes already rule it out keeps its
// outcome, and so do the candidates only it ended: a waiting node is
// always one that its pending dependencies still decide. The candidates
// are decided in the graph's order, a node after its dependencies.
func rerun(nodes []retryNode, roots []int) (nodeSet, map[int]depCounts, map[int]bool) {
	cand := map[int]bool{}
	queue := slices.Clone(roots)
	for _, r := range roots {
		cand[r] = true
	}
	for k := 0; k < len(queue); k++ {
		for _, d := range nodes[queue[k]].next {
			if !cand[d] && (nodes[d].failed() || nodes[d].rule == string(store.RuleFinally) && nodes[d].ended()) {
				cand[d] = true
				queue = append(queue, d)
			}
		}
	}
	// Kahn's order of the candidates, by their edges among themselves.
	indeg := map[int]int{}
	for i := range cand {
		for _, d := range nodes[i].deps {
			if cand[d] {
				indeg[i]++
			}
		}
	}
	var order []int
	for i := range cand {
		if indeg[i] == 0 {
			order = append(order, i)
		}
	}
	slices.Sort(order) // a stable order for ties
	for k := 0; k < len(order); k++ {
		for _, d := range nodes[order[k]].next {
			if cand[d] {
				if indeg[d]--; indeg[d] == 0 {
					order = append(order, d)
				}
			}
		}
	}
	s := nodeSet{in: map[int]bool{}}
	counts, ready := map[int]depCounts{}, map[int]bool{}
	for _, i := range order {
		var c depCounts
		for _, d := range nodes[i].deps {
			c.add(nodes[d], s.in[d])
		}
		verdict := c.verdict(nodes[i].rule, len(nodes[i].deps))
		if verdict == "skip" {
			continue
		}
		s.in[i] = true
		s.order = append(s.order, i)
		counts[i], ready[i] = c, verdict == "run"
	}
	// The rows are updated in id order, as other writers of several nodes
	// lock them.
	slices.SortFunc(s.order, func(a, b int) int { return strings.Compare(nodes[a].id, nodes[b].id) })
	return s, counts, ready
}

// depCounts counts a node's dependencies by outcome.
type depCounts struct{ pending, ok, failed, skipped int }

// add counts the dependency d; again says it runs again (it is pending).
func (c *depCounts) add(d retryNode, again bool) {
	switch {
	case again || !d.ended():
		c.pending++
	case d.status == "success":
		c.ok++
	case d.code == api.CodeSkipped:
		c.skipped++
	default:
		c.failed++
	}
}

// verdict is what the rule of a node with deps dependencies decides on
// the counts c, as depsEndedSQL decides it: "run", "skip", or "" (it
// waits for its pending dependencies).
func (c depCounts) verdict(rule string, deps int) string {
	switch {
	case deps == 0:
		return "run"
	case rule == string(api.RuleAllEnded) || rule == string(store.RuleFinally):
	case rule == string(api.RuleAnySucceeded):
		if c.ok > 0 {
			return "run"
		}
		if c.pending == 0 {
			return "skip"
		}
	case rule == string(api.RuleNoneFailed):
		if c.failed > 0 {
			return "skip"
		}
	default:
		if c.failed+c.skipped > 0 {
			return "skip"
		}
	}
	if c.pending == 0 {
		return "run"
	}
	return ""
}
