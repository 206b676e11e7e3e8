package impl

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stinthq/stint/api"
)

// liveHeartbeatAge is how old a node's heartbeat may be for the node to
// count as live: ten heartbeat intervals of the default 5 seconds, the age
// at which the default maintenance drops a node as dead.
const liveHeartbeatAge = 50 * time.Second

// liveNodes returns the registered nodes whose heartbeat is no older than
// liveHeartbeatAge, oldest first.
func (c *Client) liveNodes(ctx context.Context) ([]api.Node, error) {
	nodes, err := c.st.Nodes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return slices.DeleteFunc(nodes, func(n api.Node) bool { return n.HeartbeatAge > liveHeartbeatAge }), nil
}

// runsBehavior reports whether node n runs behavior b.
func runsBehavior(n api.Node, b api.BehaviorID) bool {
	return slices.Contains(n.Behaviors, b)
}

// whoRunsWhat says which live node runs which behaviors: "node-a runs
// demo.echo, cleanup; node-b runs report.build", or "no node is live".
func whoRunsWhat(nodes []api.Node) string {
	if len(nodes) == 0 {
		return "no node is live"
	}
	parts := make([]string, len(nodes))
	for i, n := range nodes {
		names := make([]string, len(n.Behaviors))
		for j, b := range n.Behaviors {
			names[j] = string(b)
		}
		if len(names) == 0 {
			parts[i] = n.ID + " runs nothing"
			continue
		}
		parts[i] = n.ID + " runs " + strings.Join(names, ", ")
	}
	return strings.Join(parts, "; ")
}

// checkKnownBehavior returns nil when b is in the client's registry or a
// live node runs it, else an *api.InvalidError wrapping
// api.ErrUnknownBehavior that says which nodes run what.
func (c *Client) checkKnownBehavior(ctx context.Context, b api.BehaviorID) error {
	if _, ok := c.reg.Lookup(b); ok {
		return nil
	}
	nodes, err := c.liveNodes(ctx)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(nodes, func(n api.Node) bool { return runsBehavior(n, b) }) {
		return nil
	}
	return &api.InvalidError{Field: "behavior", Err: api.ErrUnknownBehavior,
		Reason: fmt.Sprintf("%q is not registered here and no live node runs it (%s)", b, whoRunsWhat(nodes))}
}
