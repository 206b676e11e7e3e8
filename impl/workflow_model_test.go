package impl_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// TestWorkflowsAgainstAModel runs random workflows (random graphs, every
// rule, some with a finally node, each node set to succeed or fail for
// good) on two servers and checks every node against a reference model
// that walks the graph in order: whether it ran (once) or was skipped, its
// outcome, that it started only after each of its dependencies ended, and
// the workflow's state.
func TestWorkflowsAgainstAModel(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("m1", 5*time.Second)
	e.server("m2", 5*time.Second)
	c := e.client()
	rules := []api.Rule{"", api.RuleAllEnded, api.RuleAnySucceeded, api.RuleNoneFailed}
	const workflows = 6
	type plan struct {
		req  api.WorkflowRequest
		fail map[string]bool
	}
	plans := make([]plan, workflows)
	for w := range plans {
		rng := rand.New(rand.NewPCG(uint64(w), 42))
		n := 5 + rng.IntN(20)
		p := plan{req: api.WorkflowRequest{ID: api.TaskID(fmt.Sprintf("model-%d", w))}, fail: map[string]bool{}}
		for i := range n {
			name := fmt.Sprint("n", i)
			node := api.WorkflowNode{Name: name, Rule: rules[rng.IntN(len(rules))]}
			for j := range i { // edges only to earlier nodes: no cycle
				if rng.IntN(4) == 0 {
					node.DependsOn = append(node.DependsOn, fmt.Sprint("n", j))
				}
			}
			p.fail[name] = rng.IntN(4) == 0
			params := WorkParams{Key: string(p.req.ID) + "-" + name}
			if p.fail[name] {
				params.FailUntil, params.Permanent = 9, true
			}
			node.Task = workReq(workKind, params)
			p.req.Nodes = append(p.req.Nodes, node)
		}
		if w%2 == 0 {
			fin := api.WorkflowNode{Name: "fin", Finally: true, Task: workReq(workKind, WorkParams{Key: string(p.req.ID) + "-fin"})}
			p.req.Nodes = append(p.req.Nodes, fin)
		}
		plans[w] = p
		_, err := c.SubmitWorkflow(e.ctx, p.req)
		require.NoError(t, err)
	}
	for _, p := range plans {
		w, err := c.AwaitWorkflow(e.ctx, p.req.ID)
		require.NoError(t, err)
		// The model: each node's outcome from its dependencies' in order.
		outcome := map[string]string{}
		anyFailed := false
		for _, n := range p.req.Nodes {
			deps := n.DependsOn
			if n.Finally {
				deps = nil
				for _, m := range p.req.Nodes {
					if m.Name != n.Name {
						deps = append(deps, m.Name)
					}
				}
			}
			ok, failed, skipped := 0, 0, 0
			for _, d := range deps {
				switch outcome[d] {
				case "success":
					ok++
				case "failed":
					failed++
				default:
					skipped++
				}
			}
			runs := true
			switch {
			case n.Finally || n.Rule == api.RuleAllEnded:
			case n.Rule == api.RuleAnySucceeded:
				runs = len(deps) == 0 || ok > 0
			case n.Rule == api.RuleNoneFailed:
				runs = failed == 0
			default:
				runs = failed+skipped == 0
			}
			switch {
			case !runs:
				outcome[n.Name] = "skipped"
			case p.fail[n.Name]:
				outcome[n.Name] = "failed"
				anyFailed = true
			default:
				outcome[n.Name] = "success"
			}
		}
		want := api.WorkflowSucceeded
		if anyFailed {
			want = api.WorkflowFailed
		}
		require.Equal(t, want, w.State, p.req.ID)
		for _, n := range w.Nodes {
			got := "success"
			if n.Task.Status == api.StatusFailure {
				got = "failed"
				if n.Task.Error.Code == api.CodeSkipped {
					got = "skipped"
				}
			}
			require.Equal(t, outcome[n.Name], got, "%s/%s", p.req.ID, n.Name)
			runs := e.count(`SELECT count(*) FROM test_run WHERE task_id = $1`, string(n.Task.ID))
			if got == "skipped" {
				require.Zero(t, runs, "%s never runs", n.Task.ID)
			} else {
				require.Equal(t, 1, runs, "%s runs once", n.Task.ID)
			}
			if n.Rule == api.RuleAnySucceeded && len(n.DependsOn) > 0 {
				// It may start once one dependency succeeded.
				require.Zero(t, e.count(`SELECT count(*) FROM test_run r WHERE r.task_id = $1 AND NOT EXISTS (
					SELECT 1 FROM stint_dependency e JOIN stint_task d ON d.id = e.depends_on
					WHERE e.task_id = r.task_id AND d.status = 'success' AND d.finished_at <= r.at)`,
					string(n.Task.ID)), "%s started before a dependency succeeded", n.Task.ID)
				continue
			}
			require.Zero(t, e.count(`SELECT count(*) FROM test_run r, stint_dependency e, stint_task d
				WHERE r.task_id = $1 AND e.task_id = r.task_id AND d.id = e.depends_on AND (d.finished_at IS NULL OR r.at < d.finished_at)`,
				string(n.Task.ID)), "%s started before a dependency ended", n.Task.ID)
		}
	}
}
