package impl_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// TestWorkflowsAgainstAModel runs random workflows (random graphs, every
// rule, some with a finally node, some with a node that adds nodes at run
// time and makes a later node wait for them, each node set to succeed or
// fail for good) on two servers and checks every node against a reference
// model that walks the graph in order: whether it ran (once) or was
// skipped, its outcome, that it started only after each of its
// dependencies ended, and the workflow's state.
func TestWorkflowsAgainstAModel(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.growServer("m1")
	e.growServer("m2")
	rules := []api.Rule{"", api.RuleAllEnded, api.RuleAnySucceeded, api.RuleNoneFailed}
	const workflows = 8
	type plan struct {
		req  api.WorkflowRequest
		fail map[string]bool
		// grown maps a growing node's name to what it adds.
		grown map[string]api.WorkflowGrowth
	}
	workNode := func(p plan, rng *rand.Rand, name string, deps []string) api.WorkflowNode {
		node := api.WorkflowNode{Name: name, Rule: rules[rng.IntN(len(rules))], DependsOn: deps}
		p.fail[name] = rng.IntN(4) == 0
		params := WorkParams{Key: string(p.req.ID) + "-" + name}
		if p.fail[name] {
			params.FailUntil, params.Permanent = 9, true
		}
		node.Task = workReq(workKind, params)
		return node
	}
	plans := make([]plan, workflows)
	for w := range plans {
		rng := rand.New(rand.NewPCG(uint64(w), 42))
		n := 5 + rng.IntN(20)
		p := plan{req: api.WorkflowRequest{ID: api.TaskID(fmt.Sprintf("model-%d", w))}, fail: map[string]bool{}, grown: map[string]api.WorkflowGrowth{}}
		grower := -1
		if w%4 != 3 {
			grower = rng.IntN(n - 1)
		}
		for i := range n {
			name := fmt.Sprint("n", i)
			var deps []string
			for j := range i { // edges only to earlier nodes: no cycle
				if rng.IntN(4) == 0 {
					deps = append(deps, fmt.Sprint("n", j))
				}
			}
			node := workNode(p, rng, name, deps)
			if i == grower+1 && grower >= 0 {
				// The node the growth makes wait: it cannot have started
				// nor ended before its grower ended.
				if !slices.Contains(node.DependsOn, fmt.Sprint("n", grower)) {
					node.DependsOn = append(node.DependsOn, fmt.Sprint("n", grower))
				}
				node.Rule = api.RuleAllEnded
			}
			p.req.Nodes = append(p.req.Nodes, node)
		}
		if grower >= 0 {
			gname := fmt.Sprint("n", grower)
			var add api.WorkflowGrowth
			for k := range 1 + rng.IntN(4) {
				deps := []string{gname}
				for j := range grower {
					if rng.IntN(4) == 0 {
						deps = append(deps, fmt.Sprint("n", j))
					}
				}
				for _, prev := range add.Nodes {
					if rng.IntN(3) == 0 {
						deps = append(deps, prev.Name)
					}
				}
				add.Nodes = append(add.Nodes, workNode(p, rng, fmt.Sprintf("g%d", k), deps))
			}
			add.AddDependencies = map[string][]string{fmt.Sprint("n", grower+1): {add.Nodes[len(add.Nodes)-1].Name}}
			p.grown[gname] = add
			g := &p.req.Nodes[grower]
			g.Task, p.fail[gname] = api.SubmitRequest{Behavior: growKind.ID, Params: mustJSON(GrowParams{Add: add})}, false
		}
		if w%2 == 0 {
			fin := api.WorkflowNode{Name: "fin", Finally: true, Task: workReq(workKind, WorkParams{Key: string(p.req.ID) + "-fin"})}
			p.req.Nodes = append(p.req.Nodes, fin)
		}
		plans[w] = p
		_, err := srv.SubmitWorkflow(e.ctx, p.req)
		require.NoError(t, err)
	}
	for _, p := range plans {
		w, err := srv.AwaitWorkflow(e.ctx, p.req.ID)
		require.NoError(t, err)
		// The model: each node's outcome from its dependencies' in order;
		// a growing node that ran adds its nodes right after itself.
		outcome := map[string]string{}
		anyFailed := false
		nodes := slices.Clone(p.req.Nodes)
		for i := 0; i < len(nodes); i++ {
			n := nodes[i]
			deps := n.DependsOn
			if n.Finally {
				deps = nil
				for _, m := range nodes {
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
			if add, grows := p.grown[n.Name]; grows && runs {
				nodes = slices.Insert(nodes, i+1, add.Nodes...)
				for gated, news := range add.AddDependencies {
					j := slices.IndexFunc(nodes, func(m api.WorkflowNode) bool { return m.Name == gated })
					nodes[j].DependsOn = append(slices.Clone(nodes[j].DependsOn), news...)
				}
			}
		}
		require.Len(t, w.Nodes, len(nodes), "%s: the nodes, those added included", p.req.ID)
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
					SELECT 1 FROM `+allEdges+` e JOIN stint_task d ON d.id = e.depends_on
					WHERE e.task_id = r.task_id AND d.status = 'success' AND d.finished_at <= r.at)`,
					string(n.Task.ID)), "%s started before a dependency succeeded", n.Task.ID)
				continue
			}
			require.Zero(t, e.count(`SELECT count(*) FROM test_run r, `+allEdges+` e, stint_task d
				WHERE r.task_id = $1 AND e.task_id = r.task_id AND d.id = e.depends_on AND (d.finished_at IS NULL OR r.at < d.finished_at)`,
				string(n.Task.ID)), "%s (%s, depends on %v) started before a dependency ended: %s", n.Task.ID, n.Rule, n.DependsOn,
				e.dump(`SELECT r.task_id, r.at, d.id, d.status, d.finished_at FROM test_run r, `+allEdges+` e, stint_task d
				    WHERE r.task_id = $1 AND e.task_id = r.task_id AND d.id = e.depends_on`, string(n.Task.ID)))
		}
	}
}
