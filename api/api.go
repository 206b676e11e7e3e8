// Package api is what services use to submit tasks and await their results.
//
// A task is one unit of work of a behavior (a task kind), stored durably in
// PostgreSQL and run by a server node. Tasks is the interface to submit,
// inspect and await tasks; both a server (which also runs tasks) and a
// client-only process implement it. Submit is the typed entry point: it
// takes a behavior's Kind, which fixes the types of its params and result,
// and returns a Future whose Await returns the typed result (see the
// package's example).
//
// This package imports nothing else of stint's, so services can depend on it
// alone.
package api

import (
	"context"
	"encoding/json"
	"slices"
	"time"
)

// TaskID identifies a task. It is 3 to 128 characters from [A-Za-z0-9._:/@+=-],
// either derived from the params by the behavior (deterministic, so that
// equal submissions share one task) or generated.
type TaskID string

// BehaviorID names a behavior, e.g. "ingest.job". It is 3 to 64 characters
// from [a-z0-9._-], starting with a letter.
type BehaviorID string

// Status is the state of a task.
type Status string

// The task states. A task that succeeded or failed may be scheduled to run
// again (a recurring task, or a retry after a failure): it keeps its status
// and gets a due time. It is finished for good when it has no due time.
const (
	// StatusScheduled is a task waiting for its due time and a free worker.
	StatusScheduled Status = "scheduled"
	// StatusRunning is a task held by a node under a lease.
	StatusRunning Status = "running"
	// StatusSuccess is a task whose last run returned a result.
	StatusSuccess Status = "success"
	// StatusFailure is a task whose last run failed.
	StatusFailure Status = "failure"
	// StatusHeld is a task that is not claimed until it is released.
	StatusHeld Status = "held"
	// StatusRemoved appears only in events: the task was removed.
	StatusRemoved Status = "removed"
)

// Statuses returns the states a stored task may be in, in the order of a
// task's life: every Status but StatusRemoved, which only events carry.
// Filters, their help and their errors list these.
func Statuses() []Status { return slices.Clone(statuses) }

// statuses are the states of Statuses.
var statuses = []Status{StatusWaiting, StatusScheduled, StatusHeld, StatusRunning, StatusSuccess, StatusFailure}

// Valid reports whether s is one of the known states (see Statuses).
func (s Status) Valid() bool { return slices.Contains(statuses, s) }

// Task is the stored state of one task.
type Task struct {
	ID       TaskID     `json:"id"`
	Behavior BehaviorID `json:"behavior"`
	Status   Status     `json:"status"`
	// Priority orders pickup: lower runs first.
	Priority int             `json:"priority"`
	Params   json.RawMessage `json:"params"`
	// Result is the last successful run's result.
	Result json.RawMessage `json:"result,omitempty"`
	// Error is the last failed run's error.
	Error *TaskError `json:"error,omitempty"`
	// Progress is the last checkpoint of a run.
	Progress json.RawMessage `json:"progress,omitempty"`
	// ScheduleNotBefore is when the task is due next; nil when it is
	// finished for good or held. For a running task it is the lease expiry.
	ScheduleNotBefore *time.Time `json:"schedule_not_before,omitempty"`
	// LostNotBefore is the lease expiry of a running task.
	LostNotBefore *time.Time `json:"lost_not_before,omitempty"`
	// Lease is the fencing token of the current or last run. The runs that
	// one claim statement took share it.
	Lease string `json:"lease,omitempty"`
	// Node is the node running or that last ran the task.
	Node string `json:"node,omitempty"`
	// Attempt counts runs started, snoozes excluded.
	Attempt int `json:"attempt"`
	// Errors counts consecutive failures; a success resets it.
	Errors int `json:"errors"`
	// Resubmit is set when the task was submitted again while running: it
	// runs again when the current run ends.
	Resubmit bool   `json:"resubmit,omitempty"`
	ParentID TaskID `json:"parent_id,omitempty"`
	// Version is the version of the behavior that submitted the task
	// (spi.Policy.Version); zero when it has none. Only a node whose
	// version of the behavior is the same or newer runs the task.
	Version int `json:"version,omitempty"`
	// ChildrenPending counts the children spawned by this task that have
	// not ended yet.
	ChildrenPending int    `json:"children_pending,omitempty"`
	GroupKey        string `json:"group_key,omitempty"`
	Trace           string `json:"trace,omitempty"`
	// Notify is set when the task's state changes are notified (someone
	// awaits or watches it).
	Notify     bool       `json:"notify,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
	ExecutedAt *time.Time `json:"executed_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// Waiting says what a due task waits on: a rate limit or a concurrency
	// cap that holds it back (in every read), or, in Get, its behavior
	// paused, no live node that runs its behavior, or every such node
	// full; nil otherwise.
	Waiting *Wait `json:"waiting,omitempty"`
	// Retention is the task's own retention (SubmitRequest.Retention);
	// zero when its behavior's applies. In JSON, a duration string such as
	// "24h0m0s" (a number of nanoseconds is read too).
	Retention time.Duration `json:"retention,omitempty"`
	// Attempts are, in Get only, the task's runs that failed, oldest
	// first, its last run included when it failed; nil in other reads.
	// A run lost with its node (taken over after its lease expired) has
	// none, nor a failure recorded by a node of a release before this
	// field.
	Attempts []Attempt `json:"attempts,omitempty"`
	// Steps are, in Get only, the checkpoints the task's behavior kept
	// (spi.Policy.KeepSteps), oldest first; nil in other reads and for a
	// behavior that keeps none. Operator.Rewind and Operator.Fork start
	// from one of them.
	Steps []Step `json:"steps,omitempty"`
	// Events are, in Get only, the events the task published
	// (spi.RunContext.SetEvent), in key order; nil in other reads.
	Events []TaskEvent `json:"events,omitempty"`
	// Signals are, in Get only, the messages sent to the task
	// (Signals.Signal) that no run has consumed yet, oldest first; nil in
	// other reads.
	Signals []Signal `json:"signals,omitempty"`
}

// Step is a checkpoint that a behavior with spi.Policy.KeepSteps kept.
type Step struct {
	// N numbers the step among the task's steps, from 1.
	N int `json:"n"`
	// Progress is the progress the checkpoint stored.
	Progress json.RawMessage `json:"progress"`
	// At is when the checkpoint was stored.
	At time.Time `json:"at"`
}

// Attempt is a run of a task that failed.
type Attempt struct {
	// Attempt numbers the run among the task's runs, from 1.
	Attempt int `json:"attempt"`
	// Node ran it.
	Node string `json:"node,omitempty"`
	// StartedAt is when the run began; nil when unknown (a task
	// submitted again while it ran).
	StartedAt *time.Time `json:"started_at,omitempty"`
	// EndedAt is when its failure was recorded.
	EndedAt time.Time `json:"ended_at"`
	// Error is the run's error.
	Error *TaskError `json:"error,omitempty"`
}

// Finished reports whether the task has ended for good: it succeeded or
// failed and is not scheduled to run again.
func (t Task) Finished() bool {
	return (t.Status == StatusSuccess || t.Status == StatusFailure) && t.ScheduleNotBefore == nil && !t.Resubmit
}

// Retrying reports whether the task's last run failed and it runs again:
// its status is failure and it is due again at ScheduleNotBefore. Such a
// task has not failed for good; show it apart from a final failure.
func (t Task) Retrying() bool {
	return t.Status == StatusFailure && t.ScheduleNotBefore != nil
}

// SubmitRequest asks for a task to be run.
type SubmitRequest struct {
	// Behavior is the behavior to run. Required.
	Behavior BehaviorID `json:"behavior"`
	// Params is the JSON encoding of the behavior's params. Empty means {}.
	Params json.RawMessage `json:"params,omitempty"`
	// ID overrides the id the behavior would derive from the params.
	// Empty lets the behavior decide.
	ID TaskID `json:"id,omitempty"`
	// Priority overrides the behavior's default priority; nil keeps it.
	// Lower runs first; 0 to 32767.
	Priority *int `json:"priority,omitempty"`
	// Delay postpones the first run. Zero leaves it to the behavior: the
	// initial delay it computes from the params, if it does (Polaris'
	// initialDelay), else as soon as possible. A Delay given here takes
	// precedence over the behavior's.
	Delay time.Duration `json:"delay,omitempty"`
	// GroupKey scopes holds and limits, e.g. a collection.
	GroupKey string `json:"group_key,omitempty"`
	// Trace is the submitter's W3C traceparent.
	Trace string `json:"trace,omitempty"`
	// Retention keeps the task this long after it finished for good,
	// whatever its outcome, before the cleanup deletes it. Zero leaves it
	// to the behavior's policy (Retention for a success, FailureRetention
	// for a failure). It is set by the submit that creates the task; a
	// submit merged into an existing task keeps that task's. At most 100
	// years.
	Retention time.Duration `json:"retention,omitempty"`
	// Notify asks for a notification when the task finishes, so that an
	// Await anywhere wakes at once. Await sets it itself when needed; set it
	// at submit to save that write when the result will be awaited.
	Notify bool `json:"notify,omitempty"`
	// Debounce, when set, debounces the submit with the other debounced
	// submits of its id (see Debounce); nil submits as usual.
	Debounce *Debounce `json:"debounce,omitempty"`
}

// Submission is what a submit did.
type Submission struct {
	// ID is the task's id.
	ID TaskID `json:"id"`
	// Created is true when the submit stored a new task, false when the id
	// existed and the submit was merged into it.
	Created bool `json:"created"`
	// Status is the task's state after the submit.
	Status Status `json:"status"`
}

// Filter selects tasks for List and Subscribe. Zero fields match
// everything.
type Filter struct {
	// ID selects one task (Subscribe only).
	ID       TaskID     `json:"id,omitempty"`
	Behavior BehaviorID `json:"behavior,omitempty"`
	Status   Status     `json:"status,omitempty"`
	ParentID TaskID     `json:"parent_id,omitempty"`
	GroupKey string     `json:"group_key,omitempty"`
	// After is the keyset cursor: only tasks with a greater id. Pass the
	// previous page's Next.
	After TaskID `json:"after,omitempty"`
	// Limit caps the page size. Defaults to 100; at most 1000.
	Limit int `json:"limit,omitempty"`
	// Brief leaves each task's params, result and progress out of a List
	// (nil), unread: a page of tasks of a megabyte each would read and
	// carry a hundred of them for a list that shows none. Get reads them.
	Brief bool `json:"brief,omitempty"`
}

// Page is one page of a List.
type Page struct {
	Tasks []Task `json:"tasks"`
	// Next is the cursor for the next page; empty on the last page.
	Next TaskID `json:"next,omitempty"`
}

// Tasks submits, inspects and awaits tasks. Servers and client-only
// processes implement it alike.
type Tasks interface {
	// Submit stores a task durably, or merges the request into the task of
	// the same id (see Submission.Created). An unknown behavior, invalid
	// params or a bad id is an error wrapping ErrInvalid and stores nothing.
	Submit(ctx context.Context, req SubmitRequest) (Submission, error)
	// SubmitMany submits many tasks in one statement. If any request is
	// invalid, none is stored.
	SubmitMany(ctx context.Context, reqs []SubmitRequest) ([]Submission, error)
	// Get returns a task, or ErrNotFound.
	Get(ctx context.Context, id TaskID) (Task, error)
	// Await waits until the task is finished (see Task.Finished) and returns
	// it. It works in any process, whichever node runs the task, and returns
	// only committed state. It returns ErrNotFound if the task does not exist
	// or is removed while awaited. A lost database connection is not an
	// answer: Await retries until ctx ends.
	Await(ctx context.Context, id TaskID) (Task, error)
	// List returns tasks matching f in id order, a page at a time.
	List(ctx context.Context, f Filter) (Page, error)
	// Subscribe delivers the state changes of the tasks matching f, from
	// any node, in order per task. A subscription to one task (f.ID) gets
	// its current state first and ends after the task finishes for good or
	// is removed; others run until ctx ends. The channel is closed at the
	// end.
	Subscribe(ctx context.Context, f Filter) (<-chan Event, error)
	// Changes reads the change feed after the cursor since (0: from the
	// start of what the feed keeps), oldest first, and returns the cursor
	// to read after them. A reader that stores the cursor resumes there
	// after being offline, missing nothing. The feed is read in whole
	// batches: it stops once limit changes were read, and may return more.
	Changes(ctx context.Context, since int64, limit int) ([]Event, int64, error)
	// Remove deletes a task: a scheduled one is gone, a running one's
	// runner halts at its next write. ErrNotFound if it does not exist.
	// A workflow's own task goes with its nodes (Workflows.RemoveWorkflow);
	// a node of a workflow only with its workflow: ErrConflict.
	Remove(ctx context.Context, id TaskID) error
	// Hold keeps a scheduled task (or one waiting for a retry) from
	// running until Release. Of a workflow's own task, it holds the
	// workflow (Workflows.HoldWorkflow).
	Hold(ctx context.Context, id TaskID) error
	// Release makes a held task due again. Of a workflow's own task, it
	// releases the workflow (Workflows.ReleaseWorkflow).
	Release(ctx context.Context, id TaskID) error
	// Retry runs a task that failed for good again, with fresh attempts;
	// ErrConflict for one that has not. Of a workflow's own task, it
	// retries the workflow (Workflows.RetryWorkflow); of a failed or
	// cancelled node, it runs the node again with the nodes its failure
	// ended (its failed, skipped and cancelled dependents, and the finally
	// node), while the rest of the workflow keeps its state. A skipped node
	// is refused with ErrConflict: its dependencies decided it.
	Retry(ctx context.Context, id TaskID) error
}

// Event is one state change of a task, from the change feed.
type Event struct {
	// Seq numbers the statement that made the change; events of one
	// statement share it. Events come in (Seq, position) order, so the
	// events of one task are in order. Zero for the current state a
	// subscription starts with.
	Seq      int64      `json:"seq"`
	TaskID   TaskID     `json:"task_id"`
	Behavior BehaviorID `json:"behavior"`
	// Status is the new state, or StatusRemoved. A task's first event is
	// its creation, scheduled (a task a server started at once on its own
	// submit has running right after it, from the same statement).
	Status   Status `json:"status"`
	ParentID TaskID `json:"parent_id,omitempty"`
	// Final is set when nothing follows: the task finished for good or was
	// removed.
	Final bool      `json:"final"`
	At    time.Time `json:"at"`
	// Progress is set on the progress events of a running task: the
	// progress its checkpoint stored. Checkpoints are coalesced: at most
	// one progress event per task and second.
	Progress json.RawMessage `json:"progress,omitempty"`
}
