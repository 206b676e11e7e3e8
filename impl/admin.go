package impl

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// Remove deletes a task; see api.Tasks.
func (c *Client) Remove(ctx context.Context, id api.TaskID) error {
	if err := spi.CheckTaskID("id", id); err != nil {
		return err
	}
	_, err := c.st.Remove(ctx, id)
	return err
}

// Hold keeps a scheduled task from running; see api.Tasks.
func (c *Client) Hold(ctx context.Context, id api.TaskID) error {
	if err := spi.CheckTaskID("id", id); err != nil {
		return err
	}
	return c.st.Hold(ctx, id)
}

// Release makes a held task due again; see api.Tasks.
func (c *Client) Release(ctx context.Context, id api.TaskID) error {
	if err := spi.CheckTaskID("id", id); err != nil {
		return err
	}
	if err := c.st.Release(ctx, id); err != nil {
		return err
	}
	c.kick.kick(false)
	return nil
}

// Retry runs a task that failed for good again; see api.Tasks.
func (c *Client) Retry(ctx context.Context, id api.TaskID) error {
	if err := spi.CheckTaskID("id", id); err != nil {
		return err
	}
	if err := c.st.Retry(ctx, id); err != nil {
		return err
	}
	c.kick.kick(false)
	return nil
}

// maxFailReason caps the reason of a Fail, in bytes.
const maxFailReason = 1000

// Fail ends a waiting task as failed for good, by hand; see api.Operator.
func (c *Client) Fail(ctx context.Context, id api.TaskID, reason string) error {
	if err := spi.CheckTaskID("id", id); err != nil {
		return err
	}
	reason = strings.TrimSpace(reason)
	if reason == "" || len(reason) > maxFailReason || !spi.Printable(reason) {
		return api.Invalid("reason", "must be 1 to %d bytes of printable text", maxFailReason)
	}
	return c.st.Fail(ctx, id, &api.TaskError{Code: api.FailedByHand, Message: "failed by hand: " + reason})
}

// HoldGroup keeps every task of a group key from being claimed, on all
// nodes, until ReleaseGroup. Running tasks run on.
func (c *Client) HoldGroup(ctx context.Context, key string) error {
	if err := spi.CheckGroupKey("group_key", key); err != nil {
		return err
	}
	return c.st.HoldGroup(ctx, key)
}

// ReleaseGroup lifts a group hold.
func (c *Client) ReleaseGroup(ctx context.Context, key string) error {
	if err := spi.CheckGroupKey("group_key", key); err != nil {
		return err
	}
	return c.st.ReleaseGroup(ctx, key)
}

// HeldGroups lists the held group keys.
func (c *Client) HeldGroups(ctx context.Context) ([]string, error) { return c.st.HeldGroups(ctx) }

// Pause stops claims of a behavior on every node until Resume. Running
// tasks run on.
func (c *Client) Pause(ctx context.Context, behavior api.BehaviorID) error {
	if behavior == api.WorkflowBehavior {
		return fmt.Errorf("pause %s: it records the outcome of every workflow; hold a workflow, or pause the behaviors of its nodes: %w",
			behavior, api.ErrConflict)
	}
	return c.updateBehavior(ctx, behavior, func(b *store.BehaviorSettings) { b.Paused = true })
}

// Resume lifts a Pause.
func (c *Client) Resume(ctx context.Context, behavior api.BehaviorID) error {
	return c.updateBehavior(ctx, behavior, func(b *store.BehaviorSettings) { b.Paused = false })
}

// SetLease sets a behavior's lease (couch_jobs' activity timeout) on every
// node, for claims from now on; zero goes back to the behavior's policy.
func (c *Client) SetLease(ctx context.Context, behavior api.BehaviorID, lease time.Duration) error {
	if lease != 0 && lease < time.Second {
		return api.Invalid("lease", "%s is below the minimum of 1s", lease)
	}
	return c.updateBehavior(ctx, behavior, func(b *store.BehaviorSettings) { b.Lease = lease })
}

// BehaviorSettings returns the runtime settings of a behavior.
func (c *Client) BehaviorSettings(ctx context.Context, behavior api.BehaviorID) (store.BehaviorSettings, error) {
	all, err := c.st.Behaviors(ctx)
	if err != nil {
		return store.BehaviorSettings{}, err
	}
	for _, b := range all {
		if b.Behavior == behavior {
			return b, nil
		}
	}
	return store.BehaviorSettings{Behavior: behavior}, nil
}

func (c *Client) updateBehavior(ctx context.Context, behavior api.BehaviorID, change func(*store.BehaviorSettings)) error {
	if _, ok := c.reg.Lookup(behavior); !ok {
		return &api.InvalidError{Field: "behavior", Reason: fmt.Sprintf("%q is not registered", behavior), Err: api.ErrUnknownBehavior}
	}
	b, err := c.BehaviorSettings(ctx, behavior)
	if err != nil {
		return err
	}
	change(&b)
	return c.st.SetBehavior(ctx, b)
}

// PendingCount counts the tasks of a behavior that are due within
// lookAhead and not running or held (couch_jobs' pending_count).
func (c *Client) PendingCount(ctx context.Context, behavior api.BehaviorID, lookAhead time.Duration) (int, error) {
	if err := spi.CheckBehaviorID(behavior); err != nil {
		return 0, err
	}
	return c.st.PendingCount(ctx, behavior, lookAhead)
}

// Changes reads the change feed; see api.Tasks.
func (c *Client) Changes(ctx context.Context, since int64, limit int) ([]api.Event, int64, error) {
	return c.ReadFeed(ctx, api.ChangeFilter{Since: since, Limit: limit})
}

// ReadFeed reads the change feed with a filter; see api.Operator.
func (c *Client) ReadFeed(ctx context.Context, f api.ChangeFilter) ([]api.Event, int64, error) {
	if f.Since < 0 {
		return nil, f.Since, api.Invalid("since", "%d is negative", f.Since)
	}
	if f.Limit < 0 || f.Limit > maxFeedRead {
		return nil, f.Since, api.Invalid("limit", "%d is outside 0..%d", f.Limit, maxFeedRead)
	}
	if f.Status != "" && !f.Status.Valid() {
		return nil, f.Since, api.Invalid("status", "unknown status %q", f.Status)
	}
	return c.st.Changes(ctx, f)
}

// maxFeedRead bounds one read of the change feed.
const maxFeedRead = 100000

// FeedHead returns the cursor a new feed reader starts at; see
// api.Operator.
func (c *Client) FeedHead(ctx context.Context) (int64, error) { return c.st.FeedHead(ctx) }

// RecentChanges returns the latest limit changes, newest first; limit is
// 1..maxFeedRead.
func (c *Client) RecentChanges(ctx context.Context, limit int) ([]api.Event, error) {
	if limit < 1 || limit > maxFeedRead {
		return nil, api.Invalid("limit", "%d is outside 1..%d", limit, maxFeedRead)
	}
	return c.st.RecentChanges(ctx, limit)
}

// Nodes lists the registered server nodes; see api.Operator.
func (c *Client) Nodes(ctx context.Context) ([]api.Node, error) { return c.st.Nodes(ctx) }

// Behaviors lists the behaviors with runtime settings; see api.Operator.
func (c *Client) Behaviors(ctx context.Context) ([]api.BehaviorSettings, error) {
	return c.st.Behaviors(ctx)
}

// TaskStats returns a snapshot of the task counts; see api.Operator.
func (c *Client) TaskStats(ctx context.Context) (api.Stats, error) { return c.st.Stats(ctx) }

// QueueLag returns how long the longest-waiting due task has been due;
// see api.Operator.
func (c *Client) QueueLag(ctx context.Context) (time.Duration, error) { return c.st.QueueLag(ctx) }

// AckChanges records that the named consumer has handled the feed up to
// cursor, and that it is alive. The feed is kept for the slowest live
// consumer; a consumer that does not ack for Maintenance.ConsumerTimeout
// is dropped.
func (c *Client) AckChanges(ctx context.Context, consumer string, cursor int64) error {
	if consumer == "" || len(consumer) > 128 || !spi.Printable(consumer) {
		return api.Invalid("consumer", "must be 1 to 128 printable characters")
	}
	return c.st.AckFeed(ctx, consumer, cursor)
}

// Subscribe delivers state changes of matching tasks; see api.Tasks. It
// reads the change feed, woken by finish notifications and polling every
// PollInterval.
func (c *Client) Subscribe(ctx context.Context, f api.Filter) (<-chan api.Event, error) {
	if f.Status != "" && !f.Status.Valid() && f.Status != api.StatusRemoved {
		return nil, api.Invalid("status", "%q is not a task status", f.Status)
	}
	var initial *api.Event
	cursor, err := c.st.FeedHead(ctx)
	if err != nil {
		return nil, err
	}
	if f.ID != "" {
		if err := spi.CheckTaskID("id", f.ID); err != nil {
			return nil, err
		}
		// Flag the task so its finish is notified, and start from its
		// current state.
		t, err := c.st.MarkAwaited(ctx, f.ID)
		if err != nil {
			return nil, err
		}
		initial = &api.Event{TaskID: t.ID, Behavior: t.Behavior, Status: t.Status, ParentID: t.ParentID, Final: t.Finished(), At: t.UpdatedAt}
	}
	filter := store.ChangeFilter{TaskID: f.ID, Behavior: f.Behavior, ParentID: f.ParentID, Status: f.Status, Limit: 1000}
	out := make(chan api.Event, 64)
	wake, stop := c.hub.waitAll()
	go func() {
		defer close(out)
		defer stop()
		send := func(e api.Event) bool {
			select {
			case out <- e:
				return true
			case <-ctx.Done():
				return false
			}
		}
		if initial != nil {
			if !send(*initial) || initial.Final {
				return
			}
		}
		poll := time.NewTicker(c.cfg.PollInterval)
		defer poll.Stop()
		for {
			filter.Since = cursor
			events, next, err := c.st.Changes(ctx, filter)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				c.log.Warn("stint: subscription read failed; retrying", "err", err)
			}
			cursor = next
			for _, e := range events {
				if !send(e) {
					return
				}
				if f.ID != "" && e.Final {
					return
				}
			}
			if len(events) >= filter.Limit {
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-wake:
			case <-poll.C:
			}
		}
	}()
	return out, nil
}

// SetProgress replaces the progress of a task that is not running; see
// api.Operator.
func (c *Client) SetProgress(ctx context.Context, id api.TaskID, old, progress json.RawMessage, statuses ...api.Status) error {
	if err := spi.CheckTaskID("id", id); err != nil {
		return err
	}
	if !json.Valid(progress) {
		return api.Invalid("progress", "not valid JSON")
	}
	if len(statuses) == 0 {
		return api.Invalid("statuses", "name at least one status the task may have")
	}
	return c.st.SetProgress(ctx, id, old, progress, statuses)
}

// CountChildren counts the children of behavior of the parents; see
// api.Operator.
func (c *Client) CountChildren(ctx context.Context, parents []api.TaskID, behavior api.BehaviorID, progressField string) ([]api.ChildCount, error) {
	for _, p := range parents {
		if err := spi.CheckTaskID("parents", p); err != nil {
			return nil, err
		}
	}
	return c.st.CountChildren(ctx, parents, behavior, progressField)
}

var _ api.Operator = (*Client)(nil)

// History returns what each behavior did per minute over the last window,
// as the server nodes recorded it; see api.Operator.
func (c *Client) History(ctx context.Context, window time.Duration) (api.History, error) {
	return c.st.History(ctx, window)
}
