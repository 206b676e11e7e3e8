package api

import (
	"encoding/json"
	"fmt"
	"time"
)

// NodeSpec is a workflow node built by NewNode from a behavior's Kind and
// typed params, or the error of encoding its params. NewWorkflow and
// NewNodes collect them.
type NodeSpec struct {
	node WorkflowNode
	err  error
}

// NodeOption adjusts a node that NewNode builds.
type NodeOption func(*WorkflowNode)

// DependsOn names the nodes that must end before this one runs, as its
// rule says (WorkflowNode.DependsOn).
func DependsOn(names ...string) NodeOption {
	return func(n *WorkflowNode) { n.DependsOn = append(n.DependsOn, names...) }
}

// WithRule sets when the node runs (WorkflowNode.Rule); the default is
// RuleAllSucceeded.
func WithRule(r Rule) NodeOption { return func(n *WorkflowNode) { n.Rule = r } }

// Finally makes the node the workflow's finally node, which runs once
// after every other node ended (WorkflowNode.Finally).
func Finally() NodeOption { return func(n *WorkflowNode) { n.Finally = true } }

// WithTask applies submit options to the node's task: WithPriority,
// WithDelay, WithGroupKey, WithTrace. (A node's task has no id of its own:
// WithID is refused at submit.)
func WithTask(opts ...SubmitOption) NodeOption {
	return func(n *WorkflowNode) {
		for _, o := range opts {
			o(&n.Task)
		}
	}
}

// NewNode returns the node name of a workflow, a task of kind k with
// params p, adjusted by opts. Params that do not encode make its error,
// which NewWorkflow and NewNodes return.
func NewNode[P, R any](name string, k Kind[P, R], p P, opts ...NodeOption) NodeSpec {
	raw, err := json.Marshal(p)
	if err != nil {
		return NodeSpec{node: WorkflowNode{Name: name}, err: err}
	}
	n := WorkflowNode{Name: name, Task: SubmitRequest{Behavior: k.ID, Params: raw}}
	for _, o := range opts {
		o(&n)
	}
	return NodeSpec{node: n}
}

// NewGate returns the node name of a workflow that waits for a signal of
// topic, at most timeout (WorkflowNode.Gate), adjusted by opts.
func NewGate(name, topic string, timeout time.Duration, opts ...NodeOption) NodeSpec {
	n := WorkflowNode{Name: name, Gate: &Gate{Topic: topic, Timeout: timeout}}
	for _, o := range opts {
		o(&n)
	}
	return NodeSpec{node: n}
}

// Node returns the node s holds, or the error of its params' encoding.
func (s NodeSpec) Node() (WorkflowNode, error) { return s.node, s.err }

// NewNodes returns the nodes of specs, in order, as a WorkflowGrowth takes
// them. Params that did not encode are an *InvalidError naming the node's
// field (nodes[i].task.params) and its name.
func NewNodes(specs ...NodeSpec) ([]WorkflowNode, error) {
	nodes := make([]WorkflowNode, len(specs))
	for i, s := range specs {
		if s.err != nil {
			return nil, Invalid(fmt.Sprintf("nodes[%d].task.params", i), "node %q: %v", s.node.Name, s.err)
		}
		nodes[i] = s.node
	}
	return nodes, nil
}

// NewWorkflow returns the request for the workflow id (empty generates
// one) of the nodes specs, or the error of NewNodes. The graph itself is
// checked when it is submitted.
func NewWorkflow(id TaskID, specs ...NodeSpec) (WorkflowRequest, error) {
	nodes, err := NewNodes(specs...)
	if err != nil {
		return WorkflowRequest{}, err
	}
	return WorkflowRequest{ID: id, Nodes: nodes}, nil
}
