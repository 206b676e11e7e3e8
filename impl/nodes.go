package impl

import (
	"context"
	"fmt"
	"slices"
	"strconv"
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
		names := make([]string, 0, len(n.Behaviors))
		for _, b := range n.Behaviors {
			if !slices.Contains(builtinBehaviors, b) { // every node runs them: they would only lengthen the list
				names = append(names, string(b))
			}
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

// nodeWait fills t.Waiting for a due task that no claim will take as
// things stand, checked in this order: it waits for a node of a newer
// release (see versionWait), its behavior is paused (api.WaitPaused), its
// group key is held (api.WaitGroupHeld), no live node runs it
// (api.WaitNoNode, saying which nodes run what), or every live node that
// runs it is running as many tasks as its workers allow
// (api.WaitNodesFull). A task already waiting on a limit, not due,
// running, held or finished is left as it is, as is t when the database
// cannot say.
func (c *Client) nodeWait(ctx context.Context, t *api.Task) {
	if t.Waiting == nil && t.Version > 0 && waitsToRun(*t) {
		nodes, err := c.liveNodes(ctx)
		if err != nil {
			return
		}
		if t.Waiting = versionWait(nodes, t.Behavior, t.Version); t.Waiting != nil {
			return
		}
	}
	if t.Waiting != nil || t.Status == api.StatusRunning || t.Status == api.StatusHeld || t.Finished() ||
		t.ScheduleNotBefore == nil || t.ScheduleNotBefore.After(time.Now()) {
		return
	}
	settings, err := c.BehaviorSettings(ctx, t.Behavior)
	if err != nil {
		return
	}
	if settings.Paused {
		t.Waiting = &api.Wait{Reason: api.WaitPaused, Limit: string(t.Behavior)}
		return
	}
	if t.GroupKey != "" {
		held, err := c.st.HeldGroups(ctx)
		if err != nil {
			return
		}
		if slices.Contains(held, t.GroupKey) {
			t.Waiting = &api.Wait{Reason: api.WaitGroupHeld, Key: t.GroupKey}
			return
		}
	}
	nodes, err := c.liveNodes(ctx)
	if err != nil {
		return
	}
	runners := slices.DeleteFunc(slices.Clone(nodes), func(n api.Node) bool { return !runsBehavior(n, t.Behavior) })
	if len(runners) == 0 {
		t.Waiting = &api.Wait{Reason: api.WaitNoNode, Limit: string(t.Behavior), Detail: whoRunsWhat(nodes)}
		return
	}
	ids := make([]string, len(runners))
	for i, n := range runners {
		ids[i] = n.ID
	}
	running, err := c.st.RunningOn(ctx, ids)
	if err != nil {
		return
	}
	busy := make([]string, len(runners))
	for i, n := range runners {
		var r int64
		for _, nr := range running {
			if nr.Node == n.ID {
				r = nr.Running
			}
		}
		if r < int64(n.MaxWorkers) {
			return
		}
		busy[i] = fmt.Sprintf("%s runs %d of %d", n.ID, r, n.MaxWorkers)
	}
	t.Waiting = &api.Wait{Reason: api.WaitNodesFull, Limit: string(t.Behavior), Detail: strings.Join(busy, "; ")}
}

// waitsToRun reports whether t waits for a run: scheduled, or waiting for
// a retry or its next recurrence.
func waitsToRun(t api.Task) bool {
	return t.ScheduleNotBefore != nil && (t.Status == api.StatusScheduled || t.Status == api.StatusSuccess || t.Status == api.StatusFailure)
}

// versionWait returns the wait of a task of version v of behavior b when
// live nodes run b but none at version v or newer (api.WaitNoNode, saying
// which versions they run), and nil otherwise: no live node runs b at all
// is nodeWait's to say.
func versionWait(nodes []api.Node, b api.BehaviorID, v int) *api.Wait {
	var have []int
	for _, n := range nodes {
		if !runsBehavior(n, b) {
			continue
		}
		if n.BehaviorVersions[b] >= v {
			return nil
		}
		have = append(have, n.BehaviorVersions[b])
	}
	if len(have) == 0 {
		return nil
	}
	slices.Sort(have)
	runs := make([]string, 0, len(have))
	for _, h := range slices.Compact(have) {
		runs = append(runs, strconv.Itoa(h))
	}
	return &api.Wait{Reason: api.WaitNoNode, Limit: string(b), Version: v,
		Detail: fmt.Sprintf("no live node runs %s version %d (nodes run %s)", b, v, strings.Join(runs, ", "))}
}

// versionWaits sets the waits of the tasks of a page that wait for a node
// of a newer release (see versionWait).
func (c *Client) versionWaits(ctx context.Context, tasks []api.Task) {
	var nodes []api.Node
	read := false
	for i, t := range tasks {
		if t.Waiting != nil || t.Version == 0 || !waitsToRun(t) {
			continue
		}
		if !read {
			var err error
			if nodes, err = c.liveNodes(ctx); err != nil {
				return
			}
			read = true
		}
		tasks[i].Waiting = versionWait(nodes, t.Behavior, t.Version)
	}
}
