package impl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// checkName checks a name of field (an event's key, a signal's topic or
// idempotency key): 1 to 128 characters from A-Z a-z 0-9 . _ : / -.
func checkName(field, name string) error {
	ok := len(name) >= 1 && len(name) <= 128
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '/' || c == '-'
	}
	if !ok {
		return api.Invalid(field, "%q must be 1 to 128 characters from A-Z a-z 0-9 . _ : / -", name)
	}
	return nil
}

// encodeValue encodes v, the value of field, as JSON of at most max
// bytes that PostgreSQL stores as jsonb; an *api.InvalidError otherwise.
func encodeValue(field string, v any, max int) (json.RawMessage, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, api.Invalid(field, "does not encode as JSON: %v", err)
	}
	if len(raw) > max {
		return nil, api.Invalid(field, "%d bytes is over the limit of %d", len(raw), max)
	}
	if err := spi.CheckJSONB(field, raw); err != nil {
		return nil, err
	}
	return raw, nil
}

func (rc *runContext) SetEvent(ctx context.Context, key string, value any) error {
	return rc.setEvent(ctx, nil, key, value)
}

func (rc *runContext) SetEventTx(ctx context.Context, tx pgx.Tx, key string, value any) error {
	if tx == nil {
		return errors.New("set event: nil transaction")
	}
	return rc.setEvent(ctx, tx, key, value)
}

// setEvent is SetEvent, in tx when it is not nil; like a checkpoint, a
// write not in the caller's transaction is not abandoned when ctx ends.
func (rc *runContext) setEvent(ctx context.Context, tx pgx.Tx, key string, value any) error {
	id := rc.r.claimed.ID
	if err := checkName("key", key); err != nil {
		return fmt.Errorf("set event of task %s: %w", id, err)
	}
	raw, err := encodeValue("value", value, api.MaxEventBytes)
	if err != nil {
		return fmt.Errorf("set event %q of task %s: %w", key, id, err)
	}
	if tx == nil {
		var cancel context.CancelFunc
		if ctx, cancel, err = rc.sending(ctx, "set event of"); err != nil {
			return err
		}
		defer cancel()
	}
	err = rc.s.st.SetEvent(ctx, tx, rc.r.claimed.LeaseRef, key, raw)
	if errors.Is(err, api.ErrHalt) {
		rc.r.cancel(err)
	}
	return err
}

// GetEvent returns an event of a task; see api.Events.
func (c *Client) GetEvent(ctx context.Context, id api.TaskID, key string) (api.TaskEvent, error) {
	if err := spi.CheckTaskID("id", id); err != nil {
		return api.TaskEvent{}, err
	}
	if err := checkName("key", key); err != nil {
		return api.TaskEvent{}, err
	}
	events, err := c.st.Events(ctx, id, key)
	if err != nil {
		return api.TaskEvent{}, unavailable(err)
	}
	if len(events) == 0 {
		return api.TaskEvent{}, fmt.Errorf("event %q of task %s: %w", key, id, api.ErrNotFound)
	}
	return events[0], nil
}

// AwaitEvent waits for an event of a task; see api.Events. It wakes on
// the notification of the statement that sets the event (the one Await
// wakes on) and reads again every PollInterval in case one was lost,
// riding through transient database errors as Await does.
func (c *Client) AwaitEvent(ctx context.Context, id api.TaskID, key string) (api.TaskEvent, error) {
	if err := spi.CheckTaskID("id", id); err != nil {
		return api.TaskEvent{}, err
	}
	if err := checkName("key", key); err != nil {
		return api.TaskEvent{}, err
	}
	wake, stop := c.hub.wait(id)
	defer stop()
	poll := time.NewTicker(c.cfg.PollInterval)
	defer poll.Stop()
	failures := 0
	for {
		events, err := c.st.Events(ctx, id, key)
		var t api.Task
		if err == nil && len(events) == 0 {
			// Not set: the task's state says whether it still may be.
			t, err = c.st.Get(ctx, id)
		}
		switch {
		case err == nil && len(events) > 0:
			return events[0], nil
		case err == nil && t.Finished():
			return api.TaskEvent{}, fmt.Errorf("await event %q of task %s: the task finished without it: %w", key, id, api.ErrNotFound)
		case err == nil:
			failures = 0
			select {
			case <-ctx.Done():
				return api.TaskEvent{}, fmt.Errorf("await event %q of task %s: %w", key, id, ctx.Err())
			case <-wake:
			case <-poll.C:
			}
		case errors.Is(err, api.ErrNotFound):
			return api.TaskEvent{}, fmt.Errorf("await event %q of task %s: %w", key, id, err)
		case ctx.Err() != nil:
			return api.TaskEvent{}, fmt.Errorf("await event %q of task %s: %w", key, id, ctx.Err())
		case !transient(err):
			return api.TaskEvent{}, err
		default:
			failures++
			if err := spi.Sleep(ctx, spi.Backoff(c.cfg.PollInterval, 5*time.Second, failures)); err != nil {
				return api.TaskEvent{}, fmt.Errorf("await event %q of task %s: %w", key, id, ctx.Err())
			}
		}
	}
}
