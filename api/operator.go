package api

import (
	"context"
	"encoding/json"
	"time"
)

// Operator is what operators and the built-in tools (the CLI, the HTTP
// API, behaviors' admin actions) may do beyond Tasks: hold and release
// group keys, pause and resume behaviors, change a behavior's lease, and
// change the progress of a task that is not running; and read what the
// cluster looks like: nodes, behavior settings, statistics, the change
// feed. Servers and client-only processes implement it alike, so a tool
// needs only this interface, never the engine.
type Operator interface {
	Tasks
	Limits
	Workflows
	Events
	Signals
	// Fail ends a task that waits to run (scheduled, held, or due again
	// after a run: a retry or a recurrence) as failed for good, by hand.
	// Its error has the code FailedByHand and a message that says it was
	// failed by hand and why (reason, required). It counts as a finish:
	// its parent's pending children go down by one, awaiters wake and
	// subscribers see a final failure event. Retry runs it again. A
	// running task is refused with an error wrapping ErrConflict (its run
	// owns its outcome; Remove halts it), as is one that finished for
	// good, and a workflow's own task (its nodes decide its outcome:
	// cancel the workflow); a missing task is ErrNotFound. Of a workflow's
	// node, its dependents learn it failed, as of any node's failure. It
	// writes an outcome, so the
	// stint_client database role, which may not, gets a permission error.
	Fail(ctx context.Context, id TaskID, reason string) error
	// Rewind runs a task that finished for good (succeeded or failed)
	// again from its step (Task.Steps, kept by a behavior with
	// spi.Policy.KeepSteps): the task is due at once with that step's
	// progress, which its run reads with RunContext.Progress, and a fresh
	// count of attempts; the steps after it are deleted, and the run's
	// checkpoints number their steps from step+1. A task that runs or
	// waits to run is refused with an error wrapping ErrConflict, as are a
	// workflow's node and a workflow's own task (retry the node, whose
	// workflow's rules decide what runs again); an unknown task or step is
	// ErrNotFound, a step below 1 ErrInvalid.
	Rewind(ctx context.Context, id TaskID, step int) error
	// Fork submits a copy of task id as the new task newID, started from
	// its step (DBOS's fork): the same behavior, params, priority, group
	// key, version and retention, the step's progress, and the steps 1 to
	// step, due at once and top-level (no parent). The source is left as
	// it is. A newID that exists, a running source, a workflow's node and
	// a workflow's own task are refused with an error wrapping
	// ErrConflict; an unknown task or step is ErrNotFound; a bad id or a
	// step below 1 is ErrInvalid.
	Fork(ctx context.Context, id TaskID, step int, newID TaskID) (Submission, error)
	// HoldGroup keeps every task of a group key from being claimed, on all
	// nodes, until ReleaseGroup. Running tasks run on.
	HoldGroup(ctx context.Context, key string) error
	// ReleaseGroup lifts a group hold.
	ReleaseGroup(ctx context.Context, key string) error
	// HeldGroups lists the held group keys.
	HeldGroups(ctx context.Context) ([]string, error)
	// Pause stops claims of a behavior on every node; running tasks run on.
	Pause(ctx context.Context, behavior BehaviorID) error
	// Resume lifts a Pause.
	Resume(ctx context.Context, behavior BehaviorID) error
	// SetLease changes the lease of a behavior's future claims on every
	// node; zero goes back to the behavior's policy.
	SetLease(ctx context.Context, behavior BehaviorID, lease time.Duration) error
	// SetProgress replaces the progress of a task that is not running,
	// provided its progress is still old (nil: none) and its status is one
	// of statuses: a compare-and-set, so that it never overwrites a run's
	// checkpoint or a concurrent change. It returns an error wrapping
	// ErrConflict when the task changed meanwhile, ErrNotFound when it does
	// not exist. Runs record their own progress with their checkpoints.
	SetProgress(ctx context.Context, id TaskID, old, progress json.RawMessage, statuses ...Status) error
	// CountChildren counts the children of behavior of each parent,
	// grouped as ChildCount says.
	CountChildren(ctx context.Context, parents []TaskID, behavior BehaviorID, progressField string) ([]ChildCount, error)
	// Schedules lists the periodic schedules with their next tick.
	Schedules(ctx context.Context) ([]ScheduleInfo, error)
	// AddSchedule stores a schedule, or replaces the added one of its name.
	AddSchedule(ctx context.Context, s Schedule) error
	// RemoveSchedule deletes a schedule; ErrNotFound if there is none.
	RemoveSchedule(ctx context.Context, name string) error

	// Nodes lists the registered server nodes, oldest first.
	Nodes(ctx context.Context) ([]Node, error)
	// Behaviors lists the runtime settings (pause, lease) of the behaviors
	// whose settings were ever changed.
	Behaviors(ctx context.Context) ([]BehaviorSettings, error)
	// TaskStats returns a consistent snapshot of the task counts.
	TaskStats(ctx context.Context) (Stats, error)
	// QueueLag returns how long the longest-waiting due task (not running,
	// not held) has been due; zero when none is.
	QueueLag(ctx context.Context) (time.Duration, error)
	// History returns what each behavior did per HistoryBucket over the
	// last window (at most HistoryRetention), as the server nodes recorded
	// it in the database.
	History(ctx context.Context, window time.Duration) (History, error)
	// ReadFeed reads the change feed after f.Since, in order, keeping the
	// changes f selects, and returns the cursor to read after them: the
	// filtered form of Tasks.Changes.
	ReadFeed(ctx context.Context, f ChangeFilter) ([]Event, int64, error)
	// FeedHead returns the cursor a new reader starts at: it sees every
	// change that commits after the call.
	FeedHead(ctx context.Context) (int64, error)
	// RecentChanges returns the latest limit changes, newest first.
	RecentChanges(ctx context.Context, limit int) ([]Event, error)
}

// FailedByHand is the TaskError code of a task that Operator.Fail ended.
const FailedByHand = "failed_by_hand"

// ChildCount is the number of children of one parent that share a status,
// a group key and a value of one field of their progress.
type ChildCount struct {
	ParentID TaskID
	Status   Status
	// Waiting is set for children that succeeded or failed and are due to
	// run again (a retry or a recurrence).
	Waiting  bool
	GroupKey string
	// ProgressValue is the text of the progress field that CountChildren
	// was asked to group by; empty when a child's progress has none.
	ProgressValue string
	N             int
}
