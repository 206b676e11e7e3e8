package api

import (
	"context"
	"encoding/json"
	"time"
)

// TaskEvent is a value a running task published under a key of its own
// (spi.RunContext.SetEvent): "preview ready", "50% done". A later value
// of the key replaces it. It outlives the task's retries and goes with
// the task.
type TaskEvent struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
	// At is when the value was set, by the database's clock.
	At time.Time `json:"at"`
}

// MaxEventBytes caps the JSON value of an event: 1 MiB.
const MaxEventBytes = 1 << 20

// Events reads the events tasks publish, from any process. Clients and
// servers implement it.
type Events interface {
	// GetEvent returns the event key of task id as it is now;
	// ErrNotFound when the task has not set it (or there is no such
	// task).
	GetEvent(ctx context.Context, id TaskID, key string) (TaskEvent, error)
	// AwaitEvent waits until task id sets the event key and returns it,
	// woken by the notification of the run's statement that sets it;
	// at once when it is set already. It returns an error wrapping
	// ErrNotFound when there is no such task, or when the task finished
	// for good without setting it.
	AwaitEvent(ctx context.Context, id TaskID, key string) (TaskEvent, error)
}
