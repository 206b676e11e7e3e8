package api

import (
	"context"
	"encoding/json"
	"time"
)

// Signal is a message sent to a task under a topic (Signals.Signal): a
// bank's webhook, a person's approval. The task's runs receive a topic's
// messages in the order they were stored, each once
// (spi.RunContext.Receive).
type Signal struct {
	// Seq orders the task's messages: a later message has a greater one.
	Seq   int64  `json:"seq"`
	Topic string `json:"topic"`
	// Payload is the message, JSON.
	Payload json.RawMessage `json:"payload"`
	// Key is the idempotency key it was sent with; empty when none.
	Key string `json:"key,omitempty"`
	// At is when it was stored, by the database's clock.
	At time.Time `json:"at"`
}

// MaxSignalBytes caps the JSON payload of a signal: 1 MiB.
const MaxSignalBytes = 1 << 20

// SignalOption sets an option of a signal.
type SignalOption func(*SignalOptions)

// SignalOptions are a signal's options, as its SignalOptions set them.
type SignalOptions struct {
	// Key is the idempotency key: a second signal of the task with the
	// same key stores nothing. Empty means none. 1 to 128 characters from
	// A-Z a-z 0-9 . _ : / -.
	Key string `json:"key,omitempty"`
}

// SignalKey sets a signal's idempotency key: a second signal of the same
// task with the same key, consumed or not, stores nothing, so a webhook
// delivered twice is received once.
func SignalKey(key string) SignalOption { return func(o *SignalOptions) { o.Key = key } }

// Signals sends messages to tasks. Clients and servers implement it.
type Signals interface {
	// Signal stores payload (encoded as JSON, at most MaxSignalBytes)
	// for task id under topic, durable once it returns. A task asleep on
	// the topic (spi.WaitForSignal) is due from the same transaction; a
	// task that has not started or is running receives it when its run
	// asks. It returns an error wrapping ErrNotFound when there is no
	// such task, ErrConflict when the task has finished for good or is a
	// workflow's own task (signal its nodes), and an *InvalidError for a
	// bad topic, key or payload, storing nothing. Topics are 1 to 128
	// characters from A-Z a-z 0-9 . _ : / -. A signal whose idempotency
	// key (SignalKey) the task has seen stores nothing and returns nil.
	//
	// A task that finished for good is reopened instead of refused when
	// its behavior's policy, in the Registry of the client or server that
	// sends the signal, has spi.Policy.ReopenOnSignal: it is scheduled
	// again at once, as a resubmit of a finished task is, and its next run
	// receives the message. A workflow's node or own task is never
	// reopened.
	//
	// Concurrent Signals of one client share a transaction and its
	// commit; each caller still gets its own outcome, and a refusal of
	// one (a missing or finished task) stores the others all the same.
	Signal(ctx context.Context, id TaskID, topic string, payload any, opts ...SignalOption) error
	// SignalMany stores the messages of reqs, all or none, in one
	// transaction: one round trip whatever their number. A task's
	// messages are stored in the order of reqs; of two with the same task
	// and key, the first is stored and the second is nothing. It checks
	// each request as Signal does, and refuses the whole call, storing
	// nothing, with Signal's error for the first request refused (an
	// *InvalidError, ErrNotFound or ErrConflict) naming its index; it
	// reopens a finished task as Signal does, and none when it refuses.
	// No requests store nothing and return nil.
	SignalMany(ctx context.Context, reqs []SignalRequest) error
}

// SignalRequest is a message for Signals.SignalMany: Signal's arguments.
type SignalRequest struct {
	// ID is the task the message is for. Required.
	ID TaskID `json:"id"`
	// Topic is the message's topic: 1 to 128 characters from A-Z a-z 0-9
	// . _ : / -. Required.
	Topic string `json:"topic"`
	// Payload is the message, encoded as JSON of at most MaxSignalBytes;
	// nil is JSON's null.
	Payload any `json:"payload"`
	// Key is the idempotency key, as SignalKey sets it; empty means none.
	Key string `json:"key,omitempty"`
}
