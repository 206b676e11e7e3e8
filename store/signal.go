package store

import (
	"encoding/json"
	"errors"

	"github.com/stinthq/stint/api"
)

// NewSignal is a message for a task, as Store.Signal stores it.
type NewSignal struct {
	ID    api.TaskID
	Topic string
	// Payload is the message, JSON that PostgreSQL stores as jsonb.
	Payload json.RawMessage
	// Key is the idempotency key; empty for none.
	Key string
}

// SignalLock says how Store.Signal takes the rows of its tasks.
type SignalLock int

const (
	// SignalWait waits for each task's row.
	SignalWait SignalLock = iota
	// SignalAll waits for each task's row, and stores every message or,
	// when it refuses one, none.
	SignalAll
	// SignalPass, outside a caller's transaction, waits for no row: the
	// messages of a task whose row another transaction holds are not
	// stored, and refused says so with an error wrapping ErrBusy.
	SignalPass
)

// SignalOptions say how Store.Signal stores its messages.
type SignalOptions struct {
	// Lock says how the tasks' rows are waited for, and whether all
	// messages are stored or none.
	Lock SignalLock
	// Reopen are the behaviors whose tasks that finished for good a
	// message reopens (spi.Policy.ReopenOnSignal): the task is stored
	// scheduled, due at once, as a resubmit of a finished task stores it,
	// rather than refused. Only a stored message reopens: one whose key
	// the task has seen does not. A workflow's node or own task is never
	// reopened.
	Reopen []api.BehaviorID
}

// ErrBusy is the refusal of a message by Store.Signal with SignalPass
// whose task's row another transaction held: nothing was stored for it.
var ErrBusy = errors.New("the task's row is held by another transaction")
