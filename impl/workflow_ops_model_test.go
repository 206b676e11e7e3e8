package impl_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
)

var (
	flagWorkflowOpsLong = flag.Duration("workflow.ops.duration", 0,
		"TestWorkflowOperationsKeepTheRules: draw sequences for this long instead of -workflow.ops.seqs")
	flagWorkflowOpsSeqs = flag.Int("workflow.ops.seqs", 2, "TestWorkflowOperationsKeepTheRules: the sequences to draw")
	flagWorkflowOpsSeed = flag.Uint64("workflow.ops.seed", 0, "TestWorkflowOperationsKeepTheRules: the first sequence's seed (0: from the clock)")
)

// TestWorkflowOperationsKeepTheRules applies every operation of the table
// in docs/workflows.md, at random, to random workflows, their nodes and
// own tasks and to plain tasks while nodes run, retry, wait or are held.
// Each answer must be the table's (nil, ErrConflict or ErrNotFound), and
// after each the invariants must hold in one snapshot (invariantsSQL); at
// the end every workflow ends and its skipped nodes are those their rules
// skip. -workflow.ops.seed replays a logged seed; -workflow.ops.duration
// runs sequences for that long.
func TestWorkflowOperationsKeepTheRules(t *testing.T) {
	t.Parallel()
	seed := *flagWorkflowOpsSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	deadline := time.Now().Add(*flagWorkflowOpsLong)
	ops := 0
	for i := 0; ; i++ {
		if *flagWorkflowOpsLong > 0 && time.Now().After(deadline) || *flagWorkflowOpsLong == 0 && i == *flagWorkflowOpsSeqs {
			t.Logf("%d sequences, %d operations", i, ops)
			return
		}
		s := seed + uint64(i)
		var n int
		if !t.Run(fmt.Sprint("seed=", s), func(t *testing.T) { n = runOpsSequence(t, s) }) {
			return
		}
		ops += n
	}
}

// opsSeq is one sequence of TestWorkflowOperationsKeepTheRules.
type opsSeq struct {
	t      *testing.T
	e      *env
	srv    *impl.Server
	rng    *rand.Rand
	wfs    []api.TaskID
	nodes  []opsNode
	plains []api.TaskID
	gates  []string
	opened map[string]bool
	// signalled are the gate nodes (api.Gate) drawn: a signal of
	// gateTopic lets one pass.
	signalled []api.TaskID
	next      int // the number of the last workflow drawn
}

// gateTopic is the topic of the sequences' gate nodes.
const gateTopic = "go"

// opsNode is a node as the sequence drew it.
type opsNode struct {
	id       api.TaskID
	behavior api.BehaviorID
	share    bool
	grown    bool // added by a growth: it exists once its grower ran
}

// runOpsSequence runs the sequence of seed and returns how many
// operations it applied.
func runOpsSequence(t *testing.T, seed uint64) int {
	e := setup(t)
	srv := e.growServer("o1")
	e.growServer("o2")
	s := &opsSeq{t: t, e: e, srv: srv, rng: rand.New(rand.NewPCG(seed, 7)), opened: map[string]bool{}}
	for i := range 2 {
		f, err := srv.Submit(e.ctx, workReq(workKind, WorkParams{Key: fmt.Sprintf("plain-%d-%d", seed, i)}))
		require.NoError(t, err)
		s.plains = append(s.plains, f.ID)
	}
	for s.next = 0; s.next < 4; s.next++ {
		s.submitWorkflow(api.TaskID(fmt.Sprintf("wf-%d", s.next)))
	}
	s.next--
	const steps = 60
	for step := range steps {
		name, err := s.step()
		t.Logf("step %d: %s: %v", step, name, err)
		if err != nil {
			require.True(t, errors.Is(err, api.ErrConflict) || errors.Is(err, api.ErrNotFound),
				"step %d (%s): an operation answers success, ErrConflict or ErrNotFound: %v", step, name, err)
		}
		s.checkInvariants(fmt.Sprintf("after step %d (%s)", step, name))
	}
	s.finish()
	return steps
}

// submitWorkflow draws and submits workflow id.
func (s *opsSeq) submitWorkflow(id api.TaskID) {
	rules := []api.Rule{"", api.RuleAllEnded, api.RuleAnySucceeded, api.RuleNoneFailed}
	n := 3 + s.rng.IntN(8)
	req := api.WorkflowRequest{ID: id}
	for i := range n {
		name := fmt.Sprint("n", i)
		var deps []string
		for j := range i {
			if s.rng.IntN(3) == 0 {
				deps = append(deps, fmt.Sprint("n", j))
			}
		}
		node := api.WorkflowNode{Name: name, DependsOn: deps, Rule: rules[s.rng.IntN(len(rules))]}
		if s.rng.IntN(7) == 0 {
			node.Gate = &api.Gate{Topic: gateTopic, Timeout: time.Hour}
			s.signalled = append(s.signalled, id+"/"+api.TaskID(name))
		} else {
			node.Task = s.drawTask(id, name)
		}
		req.Nodes = append(req.Nodes, node)
	}
	grows := s.rng.IntN(3) == 0
	if grows {
		add := api.WorkflowGrowth{Nodes: []api.WorkflowNode{{Name: "g0", Task: workReq(workKind, WorkParams{Key: string(id) + "-g0"})}}}
		req.Nodes = append(req.Nodes, growNode("grow", add))
	}
	if s.rng.IntN(2) == 0 {
		req.Nodes = append(req.Nodes, api.WorkflowNode{Name: "fin", Finally: true, Task: workReq(workKind, WorkParams{Key: string(id) + "-fin"})})
	}
	_, err := s.srv.SubmitWorkflow(s.e.ctx, req)
	require.NoError(s.t, err)
	s.wfs = append(s.wfs, id)
	for _, node := range req.Nodes {
		b := node.Task.Behavior
		if node.Gate != nil {
			b = api.GateBehavior
		}
		s.nodes = append(s.nodes, opsNode{id: id + "/" + api.TaskID(node.Name), behavior: b, share: b == shareKind.ID})
	}
	if grows {
		s.nodes = append(s.nodes, opsNode{id: id + "/g0", behavior: workKind.ID, grown: true})
	}
}

// removed forgets workflow wf, which an operation removed, and draws
// another in its place.
func (s *opsSeq) removed(wf api.TaskID) {
	s.wfs = slices.DeleteFunc(s.wfs, func(id api.TaskID) bool { return id == wf })
	s.nodes = slices.DeleteFunc(s.nodes, func(n opsNode) bool { return strings.HasPrefix(string(n.id), string(wf)+"/") })
	s.next++
	s.submitWorkflow(api.TaskID(fmt.Sprintf("wf-%d", s.next)))
}

// drawTask draws a node's task: one that succeeds, fails for good, fails
// once, shares, or waits at a gate; some with a group key.
func (s *opsSeq) drawTask(wf api.TaskID, name string) api.SubmitRequest {
	key := string(wf) + "-" + name
	var req api.SubmitRequest
	switch s.rng.IntN(6) {
	case 0:
		req = workReq(workKind, WorkParams{Key: key, FailUntil: 9, Permanent: true})
	case 1:
		req = workReq(workKind, WorkParams{Key: key, FailUntil: 1})
	case 2:
		req = workReq(shareKind, WorkParams{Key: key, SleepMS: s.rng.IntN(30)})
	case 3:
		gate := "gate-" + key
		s.gates = append(s.gates, gate)
		req = flowReq(plainKind, FlowParams{ID: key, Gate: gate})
	default:
		req = workReq(workKind, WorkParams{Key: key, SleepMS: s.rng.IntN(30)})
	}
	if s.rng.IntN(4) == 0 {
		req.GroupKey = fmt.Sprint("grp-", s.rng.IntN(2))
	}
	return req
}

// step applies one random operation and returns its name and error.
func (s *opsSeq) step() (string, error) {
	ctx, c := s.e.ctx, s.srv
	wf := s.wfs[s.rng.IntN(len(s.wfs))]
	node := s.nodes[s.rng.IntN(len(s.nodes))]
	plain := s.plains[s.rng.IntN(len(s.plains))]
	must := func(name string, err error, want error) (string, error) {
		s.t.Helper()
		require.ErrorIs(s.t, err, want, name)
		return name, err
	}
	// mustNode is must for an operation on node, which may not exist
	// yet: a node that a growth adds.
	mustNode := func(name string, err error, want error) (string, error) {
		s.t.Helper()
		if node.grown && errors.Is(err, api.ErrNotFound) {
			return name, err
		}
		return must(name, err, want)
	}
	other := workReq(workKind, WorkParams{Key: "other"})
	switch op := s.rng.IntN(29); op {
	case 0:
		return "cancel " + string(wf), c.CancelWorkflow(ctx, wf)
	case 1:
		return "retry workflow " + string(wf), c.RetryWorkflow(ctx, wf)
	case 2:
		return "hold workflow " + string(wf), c.HoldWorkflow(ctx, wf)
	case 3, 4:
		return "release workflow " + string(wf), c.ReleaseWorkflow(ctx, wf)
	case 5:
		if s.rng.IntN(8) == 0 {
			err := c.RemoveWorkflow(ctx, wf)
			if err == nil {
				s.removed(wf)
			}
			return "remove workflow " + string(wf), err
		}
		return "get workflow " + string(wf), nil
	case 6, 7:
		return "retry " + string(node.id), c.Retry(ctx, node.id)
	case 8:
		return "fail " + string(node.id), c.Fail(ctx, node.id, "by the model")
	case 9:
		return "hold " + string(node.id), c.Hold(ctx, node.id)
	case 10:
		return "release " + string(node.id), c.Release(ctx, node.id)
	case 11:
		return mustNode("remove "+string(node.id), c.Remove(ctx, node.id), api.ErrConflict)
	case 12, 13:
		if node.grown {
			// Before its growth, the id is free: a submit would take it.
			return "nothing", nil
		}
		if op == 13 {
			req := api.SubmitRequest{Behavior: "demo.echo", Params: []byte(`{"text":"x"}`), ID: node.id}
			_, err := c.Submit(ctx, req)
			return must("submit another behavior as "+string(node.id), err, api.ErrConflict)
		}
		req := workReq(workKind, WorkParams{Key: "again"})
		if node.behavior != workKind.ID {
			req = flowReq(plainKind, FlowParams{ID: "again"})
		}
		req.ID = node.id
		if node.behavior == growKind.ID {
			req = api.SubmitRequest{Behavior: growKind.ID, Params: mustJSON(GrowParams{}), ID: node.id}
		}
		if node.share {
			req = workReq(shareKind, WorkParams{Key: "again"})
			req.ID = node.id
			sub, err := c.Submit(ctx, req)
			if err == nil {
				require.False(s.t, sub.Created, "a sharing submit of %s created it", node.id)
			}
			return must("share "+string(node.id), err, nil)
		}
		_, err := c.Submit(ctx, req)
		return must("resubmit "+string(node.id), err, api.ErrConflict)
	case 14:
		other.ID = wf
		_, err := c.Submit(ctx, other)
		return must("submit as workflow "+string(wf), err, api.ErrConflict)
	case 15:
		req := api.SubmitRequest{Behavior: "demo.echo", Params: []byte(`{"text":"x"}`), ID: plain}
		_, err := c.Submit(ctx, req)
		return must("submit another behavior as "+string(plain), err, api.ErrConflict)
	case 16:
		_, err := c.SubmitWorkflow(ctx, api.WorkflowRequest{ID: plain, Nodes: []api.WorkflowNode{{Name: "a", Task: other}}})
		return must("submit a workflow as "+string(plain), err, api.ErrConflict)
	case 17:
		sub, err := c.SubmitWorkflow(ctx, api.WorkflowRequest{ID: wf, Nodes: []api.WorkflowNode{{Name: "zz", Task: other}}})
		if err == nil {
			require.False(s.t, sub.Created, "a second submit of %s stores nothing", wf)
		}
		return "submit workflow " + string(wf) + " again", err
	case 18:
		return must("fail workflow task "+string(wf), c.Fail(ctx, wf, "by the model"), api.ErrConflict)
	case 19:
		switch s.rng.IntN(3) {
		case 0:
			return "hold task " + string(wf), c.Hold(ctx, wf)
		case 1:
			return "release task " + string(wf), c.Release(ctx, wf)
		}
		return "retry task " + string(wf), c.Retry(ctx, wf)
	case 20:
		key := fmt.Sprint("grp-", s.rng.IntN(2))
		if s.rng.IntN(2) == 0 {
			return "hold group " + key, c.HoldGroup(ctx, key)
		}
		return "release group " + key, c.ReleaseGroup(ctx, key)
	case 21:
		if s.rng.IntN(2) == 0 {
			return "pause", c.Pause(ctx, workKind.ID)
		}
		return "resume", c.Resume(ctx, workKind.ID)
	case 22, 23:
		if len(s.gates) > 0 {
			g := s.gates[s.rng.IntN(len(s.gates))]
			if !s.opened[g] {
				s.opened[g] = true
				s.e.openGates(g)
			}
			return "open " + g, nil
		}
		return "nothing", nil
	case 24:
		max := 1 + s.rng.IntN(2)
		return fmt.Sprint("cap at ", max), c.SetConcurrencyLimit(ctx, api.ConcurrencyLimit{Behavior: workKind.ID, Max: max})
	case 25:
		return "lift the cap", c.RemoveConcurrencyLimit(ctx, workKind.ID, "")
	case 26:
		if len(s.signalled) == 0 {
			return "nothing", nil
		}
		gate := s.signalled[s.rng.IntN(len(s.signalled))]
		return "signal " + string(gate), c.Signal(ctx, gate, gateTopic, "go")
	default:
		// Let runs go on for a moment: the operations meet nodes in every
		// state. Nothing waits on this for its correctness.
		time.Sleep(time.Duration(s.rng.IntN(40)) * time.Millisecond)
		return "pause a moment", nil
	}
}

// invariantsSQL lists, in one snapshot, what breaks a workflow's rules:
// a waiting node whose counts are not those of its dependencies'
// outcomes, or whose counts already decide it (it should have run or been
// skipped), and a workflow's own task that disagrees with its nodes (it
// waits for a number of nodes other than those that have not ended, or
// it is due, running or ended while one has not).
const invariantsSQL = `
WITH ended AS (
    SELECT t.id, t.status IN ('success', 'failure') AND t.schedule_not_before IS NULL AS ended,
        t.status = 'success' AS ok, coalesce(t.error->>'code', '') = 'skipped' AS skipped
    FROM stint_task t WHERE t.workflow_node IS NOT NULL
), counts AS (
    SELECT e.task_id, count(*) FILTER (WHERE NOT d.ended) AS pending, count(*) FILTER (WHERE d.ended AND d.ok) AS ok,
        count(*) FILTER (WHERE d.ended AND NOT d.ok AND NOT d.skipped) AS failed,
        count(*) FILTER (WHERE d.ended AND d.skipped) AS skipped
    FROM ` + allEdges + ` e JOIN ended d ON d.id = e.depends_on GROUP BY e.task_id
)
SELECT format('node %s counts %s/%s/%s/%s, its dependencies %s/%s/%s/%s', t.id,
    t.deps_pending, t.deps_succeeded, t.deps_failed, t.deps_skipped, c.pending, c.ok, c.failed, c.skipped)
FROM stint_task t JOIN counts c ON c.task_id = t.id
WHERE t.status = 'waiting' AND t.workflow_node IS NOT NULL
  AND (t.deps_pending, t.deps_succeeded, t.deps_failed, t.deps_skipped) <> (c.pending, c.ok, c.failed, c.skipped)
UNION ALL
SELECT format('node %s (%s) waits, but its counts %s/%s/%s/%s decide it', t.id, t.dep_rule,
    t.deps_pending, t.deps_succeeded, t.deps_failed, t.deps_skipped)
FROM stint_task t
WHERE t.status = 'waiting' AND t.workflow_node IS NOT NULL AND CASE t.dep_rule
    WHEN 'all_ended' THEN t.deps_pending <= 0
    WHEN 'finally' THEN t.deps_pending <= 0
    WHEN 'any_succeeded' THEN t.deps_succeeded > 0 OR t.deps_pending <= 0
    WHEN 'none_failed' THEN t.deps_failed > 0 OR t.deps_pending <= 0
    ELSE t.deps_failed + t.deps_skipped > 0 OR t.deps_pending <= 0 END
UNION ALL
SELECT format('workflow %s is %s waiting for %s nodes (waiting_children %s); %s have not ended', w.id, w.status,
    w.children_pending, w.waiting_children, n.open)
FROM stint_task w, LATERAL (SELECT count(*) FILTER (WHERE NOT e.ended) AS open
    FROM stint_task t JOIN ended e ON e.id = t.id WHERE t.parent_id = w.id AND t.workflow_node IS NOT NULL) n
WHERE w.behavior = 'stint.workflow'
  AND CASE WHEN w.waiting_children THEN w.children_pending <> n.open ELSE n.open > 0 END`

// checkInvariants fails the test when invariantsSQL finds anything.
func (s *opsSeq) checkInvariants(when string) {
	s.t.Helper()
	var broken []string
	rows, err := s.e.pool.Query(s.e.ctx, invariantsSQL)
	require.NoError(s.t, err)
	for rows.Next() {
		var b string
		require.NoError(s.t, rows.Scan(&b))
		broken = append(broken, b)
	}
	require.NoError(s.t, rows.Err())
	require.Empty(s.t, broken, "%s: the workflows' rules are broken", when)
}

// finish lifts every hold and pause, opens every gate, and checks that
// every workflow ends and answers AwaitWorkflow, with its skipped nodes
// as their rules say.
func (s *opsSeq) finish() {
	ctx, c := s.e.ctx, s.srv
	require.NoError(s.t, c.Resume(ctx, workKind.ID))
	if err := c.RemoveConcurrencyLimit(ctx, workKind.ID, ""); err != nil {
		require.ErrorIs(s.t, err, api.ErrNotFound)
	}
	for k := range 2 {
		require.NoError(s.t, c.ReleaseGroup(ctx, fmt.Sprint("grp-", k)))
	}
	for _, g := range s.gates {
		if !s.opened[g] {
			s.e.openGates(g)
		}
	}
	for _, gate := range s.signalled {
		if err := c.Signal(ctx, gate, gateTopic, "go"); err != nil {
			require.True(s.t, errors.Is(err, api.ErrConflict) || errors.Is(err, api.ErrNotFound), "signal %s: %v", gate, err)
		}
	}
	for _, wf := range s.wfs {
		if err := c.ReleaseWorkflow(ctx, wf); err != nil {
			require.True(s.t, errors.Is(err, api.ErrConflict) || errors.Is(err, api.ErrNotFound), "release %s: %v", wf, err)
		}
	}
	rows, err := s.e.pool.Query(ctx, `SELECT id FROM stint_task WHERE status = 'held' AND workflow_node IS NOT NULL`)
	require.NoError(s.t, err)
	var held []api.TaskID
	for rows.Next() {
		var id api.TaskID
		require.NoError(s.t, rows.Scan(&id))
		held = append(held, id)
	}
	require.NoError(s.t, rows.Err())
	for _, id := range held {
		require.NoError(s.t, c.Release(ctx, id))
	}
	for _, wf := range s.wfs {
		actx, cancel := context.WithTimeout(ctx, time.Minute)
		w, err := c.AwaitWorkflow(actx, wf)
		cancel()
		if errors.Is(err, api.ErrNotFound) {
			continue // removed
		}
		require.NoError(s.t, err, "workflow %s answers AwaitWorkflow once its nodes ended: %s", wf,
			s.e.dump(`SELECT id, status, schedule_not_before, error->>'code', children_pending, waiting_children,
			    deps_pending, deps_succeeded, deps_failed, deps_skipped, dep_rule, attempt, finished_at
			    FROM stint_task WHERE id = $1 OR parent_id = $1 ORDER BY id`, string(wf))+
				s.e.dump(invariantsSQL)+s.e.dump(`SELECT task_id, depends_on FROM `+allEdges+` e WHERE task_id LIKE $1 ORDER BY 1, 2`, string(wf)+"/%"))
		require.NotEqual(s.t, api.WorkflowRunning, w.State, wf)
		outcome := map[string]api.Task{}
		for _, n := range w.Nodes {
			outcome[n.Name] = n.Task
		}
		for _, n := range w.Nodes {
			if n.Task.Error == nil || n.Task.Error.Code != api.CodeSkipped || w.State == api.WorkflowCancelled {
				continue
			}
			var c depCounts
			for _, d := range n.DependsOn {
				c.add(outcome[d])
			}
			require.False(s.t, c.runs(n.Rule), "%s/%s (%s) was skipped, but its dependencies %v allow it", wf, n.Name, n.Rule, n.DependsOn)
		}
	}
	s.checkInvariants("at the end")
}

// depCounts counts a node's dependencies by outcome, for the rules.
type depCounts struct{ ok, failed, skipped int }

func (c *depCounts) add(t api.Task) {
	switch {
	case t.Status == api.StatusSuccess:
		c.ok++
	case t.Error != nil && t.Error.Code == api.CodeSkipped:
		c.skipped++
	default:
		c.failed++
	}
}

// runs says whether a node of rule runs on the ended dependencies c.
func (c depCounts) runs(rule api.Rule) bool {
	switch rule {
	case api.RuleAllEnded:
		return true
	case api.RuleAnySucceeded:
		return c.ok > 0 || c.failed+c.skipped == 0
	case api.RuleNoneFailed:
		return c.failed == 0
	}
	return c.failed+c.skipped == 0
}
