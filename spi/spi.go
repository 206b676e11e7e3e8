// Package spi is what behavior implementers use: the Behavior interface, the
// optional interfaces that tune retries, rescheduling and merging, the
// RunContext a run gets, and the Registry that maps behavior ids to
// behaviors.
//
// A behavior is a task kind: a params type P, a result type R and a Run
// function. Register it in a Registry and give the registry to a server
// (which runs tasks) and to clients (which submit them); the package's
// example declares and registers one.
package spi

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
)

// Behavior is a task kind. Its methods must be safe for concurrent use.
type Behavior[P, R any] interface {
	// Kind names the behavior and its types.
	Kind() api.Kind[P, R]
	// TaskID derives the id of a submitted task: ids.Deterministic(parts...)
	// makes equal submissions share one task; ids.Unique() makes each its
	// own.
	TaskID(ids IDs, p P) api.TaskID
	// Run does the work. Return a *api.TaskError to say whether a failure
	// may be retried (any other error is retryable), or Snooze(d) to run
	// again later without counting a failure. ctx is cancelled when the
	// lease is lost, the task is removed, the server stops, or the run
	// passes its Policy.Timeout or ActivityTimeout.
	Run(ctx context.Context, rc RunContext, p P) (R, error)
}

// PolicyProvider is implemented by behaviors that tune how their tasks run.
type PolicyProvider interface {
	Policy() Policy
}

// Starter is implemented by behaviors that act when a server that runs
// them starts, e.g. to submit a singleton task (deterministic id, so that
// many servers submit one task).
type Starter interface {
	// Start is called by Server.Start with the server's Tasks. An error
	// fails the start.
	Start(ctx context.Context, tasks api.Tasks) error
}

// SuccessRescheduler is implemented by recurring behaviors: after each
// success it says whether and when to run the task again.
type SuccessRescheduler[P, R any] interface {
	// RescheduleAfterSuccess returns the delay before the next run and true,
	// or false when the task is done.
	RescheduleAfterSuccess(p P, r R) (time.Duration, bool)
}

// FailureRescheduler is implemented by behaviors that replace the default
// retry decision (exponential backoff with jitter up to Policy.MaxAttempts,
// TaskError.Retryable respected).
type FailureRescheduler[P any] interface {
	// RescheduleAfterFailure returns the delay before the next try and
	// true, or false to fail the task for good. failures counts the
	// consecutive failures including this one.
	RescheduleAfterFailure(p P, err *api.TaskError, failures int) (time.Duration, bool)
}

// GroupKeyer is implemented by behaviors that derive a task's group key
// (the scope of group holds and GroupConcurrency) from its params, e.g. an
// ingest job's collection. A group key given at submit takes precedence.
type GroupKeyer[P any] interface {
	GroupKey(p P) string
}

// RateLimiter is implemented by behaviors whose tasks consume rate limits
// (api.RateLimit) when they start: a task starts only when every limit it
// uses admits its units, and waits (no failure, no attempt counted) until
// then. The uses are derived once, at submit, and kept with the task.
type RateLimiter[P any] interface {
	RateUses(p P) []RateUse
}

// RateUse is the use a task makes of one rate limit.
type RateUse struct {
	// Limit names the rate limit.
	Limit string
	// Key selects the limit's budget (a customer, an external API); empty
	// for one budget for all. At most 256 printable bytes.
	Key string
	// Units is how much of the budget a start consumes: at least 1 and at
	// most the limit's Limit. Zero means 1.
	Units int64
}

// InitialDelayer is implemented by behaviors that postpone a task's first
// run by a delay computed from its params (Polaris' initialDelay), e.g. a
// report due at the end of its period. It applies to every submit that
// gives no delay of its own (api.SubmitRequest.Delay zero): submits,
// children a run spawns, and schedule ticks. A Delay given at submit takes
// precedence; a negative result counts as none. Without it a task is due
// at once.
type InitialDelayer[P any] interface {
	InitialDelay(p P) time.Duration
}

// Combiner is implemented by behaviors that merge the params of a submit
// into a still scheduled task of the same id. Without it the persisted
// params are kept.
type Combiner[P any] interface {
	Combine(persisted, submitted P) P
}

// RunContext is a run's handle on its task. Its writes are fenced by the
// run's lease: when the lease is no longer the task's (taken over, removed,
// released), they change nothing and return api.ErrHalt, and the run must
// return.
type RunContext interface {
	// TaskID is the task being run.
	TaskID() api.TaskID
	// Attempt counts the runs of this task, this one included.
	Attempt() int
	// IsResubmitted reports whether the task's resubmit flag was set as of
	// this run's claim (couch_jobs' is_resubmitted): a submit of its id
	// came in while it was running (DedupResubmit), and the task runs once
	// more after the run it came in during.
	IsResubmitted() bool
	// Progress decodes the last checkpoint into v and reports whether there
	// was one. A retried or taken-over run resumes from it.
	Progress(v any) (bool, error)
	// Checkpoint stores progress (JSON-encoded). It does not renew the
	// lease (the server does that on its own) and counts as activity for
	// Policy.ActivityTimeout. It returns api.ErrHalt when the lease is lost.
	// A context that ends while the write is under way does not abandon
	// it: Checkpoint returns once the write has landed or failed (waiting
	// at most the lease), so a run's checkpoints land in the order they
	// were made, even those of goroutines canceled on a sibling's error.
	Checkpoint(ctx context.Context, progress any) error
	// CheckpointTx stores progress inside the caller's transaction, so that
	// the behavior's own writes and the checkpoint commit together or not at
	// all. It returns api.ErrHalt, and the caller must roll back, when the
	// lease is lost.
	CheckpointTx(ctx context.Context, tx pgx.Tx, progress any) error
	// SetEvent publishes value (encoded as JSON, at most
	// api.MaxEventBytes) under key, for any process to read or await
	// (api.Events) while the task runs on: "preview ready", "50% done".
	// A later value of the key replaces it. It is fenced as a checkpoint
	// is: a run that lost its lease publishes nothing and gets
	// api.ErrHalt. Keys are 1 to 128 characters from A-Z a-z 0-9 . _ : / -.
	// Events outlive the task's retries and go with the task.
	SetEvent(ctx context.Context, key string, value any) error
	// SetEventTx is SetEvent inside the caller's transaction, which must
	// roll back on api.ErrHalt.
	SetEventTx(ctx context.Context, tx pgx.Tx, key string, value any) error
	// Receive returns the oldest message sent to this task under topic
	// (api.Signals.Signal) that this run has not received yet and no run
	// consumed, and false when there is none. A message is consumed by
	// this run's next checkpoint or its finish, unless the run fails:
	// until then a run that lost its lease, or failed, consumed nothing,
	// and the next run receives the same message. So each message is
	// consumed once, by a run whose end was recorded. With CheckpointTx,
	// the messages are consumed with the caller's transaction; one that
	// rolls back consumed nothing, but the run does not receive those
	// messages again: it must return an error (its retry receives them),
	// or its next checkpoint or finish consumes them. To sleep until one
	// comes, return WaitForSignal.
	Receive(ctx context.Context, topic string) (api.Signal, bool, error)
	// SetPriority changes the priority of this task (0 to 32767, lower
	// first; an *api.InvalidError otherwise, changing nothing), e.g. to let
	// a large job yield to small ones once it knows its size. The running
	// claim is not affected: the priority orders the task's next claim,
	// after a snooze, a wait for children or a retry, and shows in Get and
	// List at once. It is fenced: a run that lost its lease changes
	// nothing and gets api.ErrHalt. Like Checkpoint, a context that ends
	// while the write is under way does not abandon it, so a run's writes
	// land in the order they were made.
	SetPriority(ctx context.Context, priority int) error
	// Heartbeat renews the lease now. The server renews leases on its own;
	// this is for runs that want to know early that they lost theirs.
	Heartbeat(ctx context.Context) error
	// Spawn submits child tasks of this task, validated like any submit.
	// It is fenced: a run that lost its lease spawns nothing and gets
	// api.ErrHalt. Children are listed with api.Filter{ParentID: id}; a
	// run may return WaitForChildren to sleep until they all end. Like
	// Checkpoint, a context that ends while the write is under way does
	// not abandon it: Spawn returns once the children are stored or not.
	Spawn(ctx context.Context, reqs ...api.SubmitRequest) ([]api.Submission, error)
	// AddNodes adds nodes to the workflow this task is a node of (the
	// fan-out whose width only the run learns), validated as a submit is
	// against the whole graph: the new nodes may depend on new and
	// existing nodes (this one included), and existing nodes that have
	// not started may wait for new ones (g.AddDependencies). A bad graph
	// is an error wrapping api.ErrInvalid; an existing node that started
	// meanwhile, api.ErrConflict; nothing is added then. It is fenced: a
	// run that lost its lease adds nothing and gets api.ErrHalt. Like
	// Checkpoint, a context that ends while the write is under way does
	// not abandon it.
	AddNodes(ctx context.Context, g api.WorkflowGrowth) error
	// AddNodesTx is AddNodes inside the caller's transaction: the nodes
	// exist once tx commits, with the behavior's own writes. It returns
	// api.ErrHalt, and the caller must roll back, when the lease is lost.
	AddNodesTx(ctx context.Context, tx pgx.Tx, g api.WorkflowGrowth) error
	// WorkflowNode returns the task of the node name of the workflow this
	// task is a node of: a dependency's outcome and result (see
	// NodeResult). api.ErrNotFound when this task is no workflow node or
	// its workflow has no such node.
	WorkflowNode(ctx context.Context, name string) (api.Task, error)
}

// NodeResult returns the result of the node name of the running task's
// workflow, decoded: typically a dependency's. A node that failed (or was
// skipped or cancelled) returns its *api.TaskError; one that has not
// ended, an error saying so. The result is decoded leniently: fields R
// has no place for (a newer release's, see Policy.Version) are left out;
// a result that does not decode says which version of its behavior wrote
// it.
func NodeResult[R any](ctx context.Context, rc RunContext, name string) (R, error) {
	var r R
	t, err := rc.WorkflowNode(ctx, name)
	switch {
	case err != nil:
		return r, err
	case !t.Finished():
		return r, fmt.Errorf("workflow node %q has not ended: it is %s", name, t.Status)
	case t.Status == api.StatusFailure:
		return r, t.Error
	}
	if err := json.Unmarshal(t.Result, &r); err != nil {
		return r, fmt.Errorf("decode result of workflow node %q (%s version %d): %w", name, t.Behavior, t.Version, err)
	}
	return r, nil
}

// SnoozeError is returned by Run (via Snooze) to run the task again after
// Delay. A snooze is neither a failure nor an attempt.
type SnoozeError struct {
	Delay time.Duration
}

func (e *SnoozeError) Error() string { return "snooze " + e.Delay.String() }

// Snooze returns the error a run returns to be run again after d.
func Snooze(d time.Duration) error { return &SnoozeError{Delay: d} }

// WaitChildrenError is returned by Run (via WaitForChildren) to release its
// worker until the task's last pending child ends.
type WaitChildrenError struct {
	// Max is the longest wait: the task runs again after it even if
	// children are still pending.
	Max time.Duration
}

func (e *WaitChildrenError) Error() string {
	return "wait for children (at most " + e.Max.String() + ")"
}

// WaitForChildren returns the error a run returns to run again once all
// the children it spawned have ended (or after max). Like a snooze, the wait
// is neither a failure nor an attempt. A parent is woken exactly once, by
// the finish of its last child.
func WaitForChildren(max time.Duration) error { return &WaitChildrenError{Max: max} }

// WaitSignalError is returned by Run (via WaitForSignal) to release its
// worker until a message of Topic comes.
type WaitSignalError struct {
	Topic string
	// Max is the longest wait: the task runs again after it even if no
	// message came.
	Max time.Duration
}

func (e *WaitSignalError) Error() string {
	return "wait for signal " + e.Topic + " (at most " + e.Max.String() + ")"
}

// WaitForSignal returns the error a run returns to sleep, holding neither
// worker nor lease, until a message of topic is sent to the task
// (api.Signals.Signal), or max passes: the transaction that stores the
// message makes the task due, and the next run receives it
// (RunContext.Receive). A message of topic not yet received when the run
// returns makes the task due at once. A max of zero or less waits without
// limit. Like a snooze, the wait is neither a failure nor an attempt; what
// the run received is consumed. A topic that is not 1 to 128 characters
// from A-Z a-z 0-9 . _ : / - fails the run with the code invalid_wait.
func WaitForSignal(topic string, max time.Duration) error {
	return &WaitSignalError{Topic: topic, Max: max}
}
