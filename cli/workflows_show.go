package cli

import (
	"container/heap"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
)

// workflowFormats are the formats of stint workflows show.
var workflowFormats = []string{"text", "json", "mermaid", "dot"}

// newWorkflowsShowCmd returns `stint workflows show`.
func (c *cli) newWorkflowsShowCmd() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show a workflow: its state, its nodes and what each waits on",
		Long: `Show a workflow. --format text (the default) prints its state and a table of its
nodes, each after the nodes it depends on (ties in name order); a list of more
than ` + strconv.Itoa(maxListed) + ` nodes in a cell is cut to its count, first and last name
("2,000 nodes: job-0000 … job-1999"). json prints the whole workflow. mermaid
and dot print its graph, for a Mermaid diagram or Graphviz, each node labelled
with its state and coloured by it; the finally node depends on the nodes no
other node depends on, and a layer wider than ` + strconv.Itoa(groupOver) + ` nodes is drawn grouped, as
on the dashboard: its nodes of the same state and the same dependencies share
one box with their count.`,
		Example: `  stint workflows show nightly-2026-11-27
  stint workflows show nightly-2026-11-27 --format dot | dot -Tsvg > graph.svg`,
		Args: exactArgs(1, "ID"),
	}
	db := addDBFlag(cmd)
	addReadDBFlag(cmd, db)
	cmd.Flags().StringVar(&format, "format", "text", orList(workflowFormats))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		if !slices.Contains(workflowFormats, format) {
			return usageErrorf("--format %q: want %s", format, orList(workflowFormats))
		}
		var w api.Workflow
		if err := c.onWorkflow(ctx, db, args[0], func(client api.Workflows, id api.TaskID) (err error) {
			w, err = client.GetWorkflow(ctx, id)
			return err
		}); err != nil {
			return err
		}
		for i := range w.Nodes {
			c.reg.RedactTask(&w.Nodes[i].Task) // no password is ever printed
		}
		switch format {
		case "json":
			return writeJSON(c.stdout, w)
		case "mermaid":
			fmt.Fprint(c.stdout, newWorkflowGraph(w).mermaid())
			return nil
		case "dot":
			fmt.Fprint(c.stdout, newWorkflowGraph(w).dot(w.ID))
			return nil
		}
		return c.printWorkflow(w)
	}
	return cmd
}

// maxListed is the most node names a cell of the text table lists; a
// longer list is cut to its count, first and last name (see nameList).
const maxListed = 3

// groupOver is the width of a graph's layer above which its nodes are
// grouped, as the dashboard groups them (web/static/workflows.js).
const groupOver = 24

// printWorkflow prints w as text: its state and counts, then a table of
// its nodes in the graph's order.
func (c *cli) printWorkflow(w api.Workflow) error {
	var counts []string
	for status, n := range w.Counts {
		counts = append(counts, fmt.Sprintf("%d %s", n, status))
	}
	sort.Strings(counts)
	fmt.Fprintf(c.stdout, "workflow %s: %s (%s", w.ID, w.State, strings.Join(counts, ", "))
	if w.Skipped > 0 {
		fmt.Fprintf(c.stdout, "; %d skipped", w.Skipped)
	}
	fmt.Fprintln(c.stdout, ")")
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "NODE\tSTATUS\tRULE\tDEPENDS ON\tWHY")
	for _, i := range newWorkflowGraph(w).order {
		n := w.Nodes[i]
		deps := nameList(n.DependsOn, ",")
		if n.Finally {
			deps = "all other nodes (finally)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Name, nodeStatus(n.Task), n.Rule, orDash(deps), orDash(nodeWhy(n.Task)))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// nameList lists node names for a table cell: all of them, separated by
// sep, up to maxListed; else their count and the first and last in name
// order, "2,000 nodes: job-0000 … job-1999".
func nameList(names []string, sep string) string {
	if len(names) <= maxListed {
		return strings.Join(names, sep)
	}
	return fmt.Sprintf("%s nodes: %s … %s", formatCount(len(names)), slices.Min(names), slices.Max(names))
}

// formatCount writes a count with a comma between groups of three
// digits: "2,000".
func formatCount(n int) string {
	s := strconv.Itoa(n)
	if n < 0 {
		return s
	}
	var b strings.Builder
	for i, d := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(d)
	}
	return b.String()
}

// nodeStatus is a node's status, with skipped and cancelled told apart
// from failed.
func nodeStatus(t api.Task) string {
	if t.Status == api.StatusFailure && t.Error != nil && (t.Error.Code == api.CodeSkipped || t.Error.Code == api.CodeCancelled) {
		return t.Error.Code
	}
	return shortStatus(t)
}

// nodeState is the state a node is coloured by, as the dashboard's:
// its status, with a failure that runs again (retrying), a skipped and a
// cancelled node told apart from a failure.
func nodeState(t api.Task) string {
	switch {
	case t.Retrying():
		return "retrying"
	case t.Status == api.StatusFailure && t.Error != nil && (t.Error.Code == api.CodeSkipped || t.Error.Code == api.CodeCancelled):
		return t.Error.Code
	}
	return string(t.Status)
}

// nodeWhy says what a node waits on, or why it did not run or failed.
func nodeWhy(t api.Task) string {
	switch {
	case t.Waiting != nil && t.Waiting.Reason == api.WaitDependencies:
		return "waits for " + nameList(t.Waiting.Dependencies, ", ")
	case t.Waiting != nil && t.Waiting.Reason == api.WaitSignal:
		return "waits for signal " + t.Waiting.Key
	case t.Waiting != nil:
		return "waits on " + t.Waiting.Reason + " " + t.Waiting.Limit
	case t.Status == api.StatusFailure && t.Error != nil:
		return t.Error.Message
	}
	return ""
}

// workflowGraph is a workflow's graph as show draws it: its nodes in
// topological order, their layers, and the boxes that stand for them.
type workflowGraph struct {
	nodes []api.WorkflowNodeState
	// deps are the indexes of each node's dependencies as drawn: the
	// finally node's are the sinks, the other nodes no node depends on.
	deps [][]int
	// order holds every node's index, each after its dependencies, ties
	// in name order.
	order []int
	// layer is each node's layer: the length of its longest path from a
	// node without dependencies.
	layer []int
	// boxes are what the graph draws, layer by layer; boxOf is each
	// node's box.
	boxes []*graphBox
	boxOf []*graphBox
	// edges join the boxes, each once, in the order they were found.
	edges []*graphEdge
}

// graphBox is a box of the graph: one node, or the nodes of a wide layer
// with the same state and the same dependencies.
type graphBox struct {
	id      string
	state   string
	members []int
}

// graphEdge is an edge between boxes, standing for count edges between
// their nodes.
type graphEdge struct {
	from, to *graphBox
	count    int
}

// newWorkflowGraph lays out w's graph.
func newWorkflowGraph(w api.Workflow) *workflowGraph {
	g := &workflowGraph{nodes: w.Nodes, deps: make([][]int, len(w.Nodes)), layer: make([]int, len(w.Nodes))}
	index := make(map[string]int, len(w.Nodes))
	for i, n := range w.Nodes {
		index[n.Name] = i
	}
	depended := make([]bool, len(w.Nodes))
	finally := -1
	for i, n := range w.Nodes {
		if n.Finally {
			finally = i
			continue
		}
		for _, d := range n.DependsOn {
			if j, ok := index[d]; ok && j != i {
				g.deps[i] = append(g.deps[i], j)
				depended[j] = true
			}
		}
	}
	if finally >= 0 {
		for i := range w.Nodes {
			if i != finally && !depended[i] {
				g.deps[finally] = append(g.deps[finally], i)
			}
		}
	}
	g.sort()
	g.group()
	return g
}

// sort fills g.order and g.layer: Kahn's algorithm, taking the ready node
// first in name order.
func (g *workflowGraph) sort() {
	dependents := make([][]int, len(g.nodes))
	pending := make([]int, len(g.nodes))
	for i, ds := range g.deps {
		pending[i] = len(ds)
		for _, d := range ds {
			dependents[d] = append(dependents[d], i)
		}
	}
	ready := &byName{nodes: g.nodes}
	for i, p := range pending {
		if p == 0 {
			ready.idx = append(ready.idx, i)
		}
	}
	heap.Init(ready)
	done := make([]bool, len(g.nodes))
	for ready.Len() > 0 {
		i := heap.Pop(ready).(int)
		g.order, done[i] = append(g.order, i), true
		for _, j := range dependents[i] {
			g.layer[j] = max(g.layer[j], g.layer[i]+1)
			if pending[j]--; pending[j] == 0 {
				heap.Push(ready, j)
			}
		}
	}
	// A cycle, which a stored workflow cannot have: its nodes go last.
	var rest []int
	for i := range g.nodes {
		if !done[i] {
			rest = append(rest, i)
		}
	}
	slices.SortFunc(rest, func(a, b int) int { return strings.Compare(g.nodes[a].Name, g.nodes[b].Name) })
	g.order = append(g.order, rest...)
}

// byName is a heap of node indexes, the least name on top.
type byName struct {
	nodes []api.WorkflowNodeState
	idx   []int
}

func (h *byName) Len() int           { return len(h.idx) }
func (h *byName) Less(a, b int) bool { return h.nodes[h.idx[a]].Name < h.nodes[h.idx[b]].Name }
func (h *byName) Swap(a, b int)      { h.idx[a], h.idx[b] = h.idx[b], h.idx[a] }
func (h *byName) Push(x any)         { h.idx = append(h.idx, x.(int)) }
func (h *byName) Pop() any {
	x := h.idx[len(h.idx)-1]
	h.idx = h.idx[:len(h.idx)-1]
	return x
}

// group makes the boxes, layer by layer in the graph's order, and the
// edges between them: in a layer wider than groupOver, the nodes of the
// same state whose dependencies are in the same boxes share one box.
func (g *workflowGraph) group() {
	var layers [][]int
	for _, i := range g.order {
		for len(layers) <= g.layer[i] {
			layers = append(layers, nil)
		}
		layers[g.layer[i]] = append(layers[g.layer[i]], i)
	}
	g.boxOf = make([]*graphBox, len(g.nodes))
	for l, members := range layers {
		byKey := map[string]*graphBox{}
		for _, i := range members {
			state := nodeState(g.nodes[i].Task)
			key := "node " + g.nodes[i].Name
			if len(members) > groupOver {
				var ids []string
				for _, d := range g.deps[i] {
					ids = append(ids, g.boxOf[d].id)
				}
				slices.Sort(ids)
				key = state + "|" + strings.Join(slices.Compact(ids), ",")
			}
			b := byKey[key]
			if b == nil {
				b = &graphBox{id: fmt.Sprintf("g%d_%d", l, len(byKey)), state: state}
				if len(members) <= groupOver {
					b.id = fmt.Sprintf("n%x", g.nodes[i].Name) // names may hold . and -
				}
				byKey[key] = b
				g.boxes = append(g.boxes, b)
			}
			b.members = append(b.members, i)
			g.boxOf[i] = b
		}
	}
	edges := map[[2]*graphBox]*graphEdge{}
	for _, i := range g.order {
		for _, d := range g.deps[i] {
			k := [2]*graphBox{g.boxOf[d], g.boxOf[i]}
			e := edges[k]
			if e == nil {
				e = &graphEdge{from: k[0], to: k[1]}
				edges[k] = e
				g.edges = append(g.edges, e)
			}
			e.count++
		}
	}
}

// label says what box b stands for: "fetch: success", "2,000 nodes:
// job-0000 … job-1999: success".
func (g *workflowGraph) label(b *graphBox) string {
	if len(b.members) == 1 {
		n := g.nodes[b.members[0]]
		return n.Name + ": " + nodeStatus(n.Task)
	}
	names := make([]string, len(b.members))
	for k, i := range b.members {
		names[k] = g.nodes[i].Name
	}
	return nameList(names, ",") + ": " + b.state
}

// stateStyle is how a node of a state is drawn: the dashboard's colours
// (web/static/app.css), dashed where the dashboard dashes.
var stateStyle = map[string]struct {
	fill, line string
	dashed     bool
}{
	"waiting":   {"#fdf2dd", "#a15c00", false},
	"held":      {"#fdf2dd", "#a15c00", true},
	"scheduled": {"#eceefc", "#4f5bd5", false},
	"running":   {"#e3f3fc", "#0b7fc1", false},
	"retrying":  {"#fff1e0", "#b45309", false},
	"success":   {"#e5f6ea", "#16803c", false},
	"failure":   {"#fdecec", "#c62828", false},
	"skipped":   {"#eef0f3", "#667085", true},
	"cancelled": {"#eef0f3", "#667085", true},
}

// mermaid returns the graph as a Mermaid flowchart, a class per state.
func (g *workflowGraph) mermaid() string {
	var b strings.Builder
	b.WriteString("graph TD\n")
	byState := map[string][]string{}
	for _, box := range g.boxes {
		fmt.Fprintf(&b, "  %s[\"%s\"]\n", box.id, strings.ReplaceAll(g.label(box), `"`, "#quot;"))
		byState[box.state] = append(byState[box.state], box.id)
	}
	for _, e := range g.edges {
		if e.count > 1 {
			fmt.Fprintf(&b, "  %s -->|\"%s\"| %s\n", e.from.id, formatCount(e.count), e.to.id)
		} else {
			fmt.Fprintf(&b, "  %s --> %s\n", e.from.id, e.to.id)
		}
	}
	for _, state := range slices.Sorted(maps.Keys(byState)) {
		s, ok := stateStyle[state]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "  classDef %s fill:%s,stroke:%s", state, s.fill, s.line)
		if s.dashed {
			b.WriteString(",stroke-dasharray:5 3")
		}
		fmt.Fprintf(&b, "\n  class %s %s\n", strings.Join(byState[state], ","), state)
	}
	return b.String()
}

// dot returns the graph of the workflow id in Graphviz's language, each
// node filled with its state's colour.
func (g *workflowGraph) dot(id api.TaskID) string {
	var b strings.Builder
	fmt.Fprintf(&b, "digraph %q {\n  node [shape=box, style=\"rounded,filled\"];\n", string(id))
	for _, box := range g.boxes {
		fmt.Fprintf(&b, "  %s [label=%q", box.id, g.label(box))
		if s, ok := stateStyle[box.state]; ok {
			fmt.Fprintf(&b, ", fillcolor=%q, color=%q", s.fill, s.line)
			if s.dashed {
				b.WriteString(`, style="rounded,filled,dashed"`)
			}
		}
		b.WriteString("];\n")
	}
	for _, e := range g.edges {
		if e.count > 1 {
			fmt.Fprintf(&b, "  %s -> %s [label=%q];\n", e.from.id, e.to.id, formatCount(e.count))
		} else {
			fmt.Fprintf(&b, "  %s -> %s;\n", e.from.id, e.to.id)
		}
	}
	b.WriteString("}\n")
	return b.String()
}
