// Package store is the persistence contract of stint: the operations the
// engine needs from its database, with their types. It holds no SQL; the
// PostgreSQL implementation is in store/postgres.
//
// Every write a runner makes carries its lease (LeaseRef) and changes
// nothing when the lease is no longer the task's: that is the fencing that
// keeps a stale node from overwriting the work of the node that took its
// task over.
package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
)

// Channels of the notifications stores send. Notifications are wake-up
// hints; every reader also polls.
const (
	// ChannelDue is notified when tasks became due; the payload is empty.
	ChannelDue = "stint_due"
	// ChannelFinished is notified when awaited tasks changed state; the
	// payload is their ids joined by commas, or empty for "check all".
	ChannelFinished = "stint_finished"
	// ChannelRemoved is notified with the id of a removed running task, so
	// that its node cancels the run at once rather than at its next lease
	// renewal.
	ChannelRemoved = "stint_removed"
	// ChannelCapped is notified with the id of a behavior when a cap
	// across nodes (FlowHeld.Capped) held back a claim of it, so that the
	// nodes whose runs of it end wake the claimers (ChannelDue) for the
	// slot they free.
	ChannelCapped = "stint_capped"
)

// NewTask is a validated task to store.
type NewTask struct {
	ID       api.TaskID
	Behavior api.BehaviorID
	Params   json.RawMessage
	Priority int
	// Delay postpones the due time from the database's now().
	Delay    time.Duration
	GroupKey string
	ParentID api.TaskID
	Trace    string
	// Notify sets the task's awaited flag: its state changes are notified.
	Notify bool
	// Retention keeps the task this long after it finished for good,
	// whatever its outcome, instead of its behavior's retention. Zero
	// leaves it to the behavior. Only the submit that creates the task
	// sets it.
	Retention time.Duration
	// Share keeps an existing task of the same id as it is (Polaris'
	// shared result) instead of resubmitting it (couch_jobs' add).
	Share bool
	// WakeClaimers makes the statement that stores the task notify the
	// claimers (ChannelDue) in its own transaction. One task of a batch
	// is enough.
	WakeClaimers bool
	// StartLease, when positive, lets SubmitStart start the task at once
	// on the submitting node under a lease of this duration (an
	// operator's lease for the behavior takes precedence, as in a
	// claim). Zero stores it as Submit does. Submit and the other
	// submits ignore it.
	StartLease time.Duration
	// RateUses are the rate limits the task consumes when it starts; a
	// task with uses starts only through a claim that takes the flow
	// controlled path (ClaimRequest.Flow). Stored with the task, and
	// replaced only where its params are.
	RateUses []RateUse
	// Version is the version of the behavior that submitted the task
	// (spi.Policy.Version): only a node whose version of the behavior is
	// the same or newer runs it. Stored with the task, and replaced only
	// where its params are.
	Version int
	// Unique says that ID was made for this submit (a new UUIDv7), so
	// that no stored task has it: the store may insert the task without
	// looking for one to merge with. Should one exist after all, the
	// submit still merges with it.
	Unique bool
	// Debounce, when set, debounces the submit (api.Debounce): Delay is
	// then its Window. Only SubmitCombined and SubmitCombinedTx store
	// such a task.
	Debounce *api.Debounce
}

// LeaseRef names a run: the task and the lease its claim issued.
type LeaseRef struct {
	ID    api.TaskID
	Lease [16]byte
}

// ClaimRequest asks for due tasks of some behaviors.
type ClaimRequest struct {
	// Node is the claiming node's id.
	Node string
	// Behaviors are the behaviors to claim, each with its lease duration.
	Behaviors []BehaviorLease
	// Limit caps how many tasks are claimed.
	Limit int
	// LookAhead also claims tasks due within this window from now, to run
	// them early. Zero claims only tasks due now.
	LookAhead time.Duration
	// PerGroup caps the running tasks per group key across all nodes;
	// zero means no cap. A capped request must name a single behavior.
	PerGroup int
	// Cluster caps the running tasks of the behavior across all nodes;
	// zero means no cap. A cap set at runtime (Limits) takes precedence,
	// as a key's does over PerGroup.
	Cluster int
	// FairShare serves the group keys with due tasks in turn, weighted,
	// instead of in strict pickup order.
	FairShare bool
	// Flow makes the claim enforce everything flow control stores (caps
	// set at runtime, the tasks' rate uses) even when the fields above
	// set nothing. A claim with any of them, or Flow, must name a single
	// behavior.
	Flow bool
	// Busy says the behavior's last claim from this node found tasks: a
	// claim under flow control then takes the behavior's turn without
	// first looking for a due hint, a second walk of the claim index past
	// the hints the claims before deleted.
	Busy bool
	// Returned names this node's runs of the behavior that returned but
	// whose end is not recorded yet: their tasks still show as running
	// under their leases, but no longer hold a slot of a cap. A claim
	// under flow control leaves them out of its running counts, so that
	// a node starts its next task when its run returns, not when the
	// completion batch commits.
	Returned []LeaseRef
	// Leases, when set, are the leases the claim issues, one per behavior
	// of Behaviors and in their order, each new: the node draws them, so
	// that it can give back what the claim took (ReleaseClaim) when it
	// fails to read the claim's answer. Unset, the store draws them.
	Leases [][16]byte
}

// Limited reports whether the claim takes the flow-controlled path.
func (r ClaimRequest) Limited() bool {
	return r.PerGroup > 0 || r.Cluster > 0 || r.FairShare || r.Flow
}

// BehaviorLease is a behavior and the lease its claims get.
type BehaviorLease struct {
	Behavior api.BehaviorID
	Lease    time.Duration
}

// Claimed is a task a claim handed to a node.
type Claimed struct {
	LeaseRef
	// LeaseDuration is the lease the claim issued; renewals extend by it.
	LeaseDuration time.Duration
	Behavior      api.BehaviorID
	Params        json.RawMessage
	Progress      json.RawMessage
	Attempt       int
	Errors        int
	Priority      int
	ParentID      api.TaskID
	GroupKey      string
	Trace         string
	// Resubmitted tells that the run is one a submit asked for while the
	// task was running (the resubmit flag of the run before).
	Resubmitted bool
	// Version is the version of the behavior that submitted the task:
	// a node whose own version is older gives the task back unrun.
	Version int
}

// LocalStart offers a statement that makes tasks due the slots of the
// node that runs it, so that it starts them there at once rather than
// leave them to a claim (see Store.FinishStart).
type LocalStart struct {
	// Node is the node the tasks start on.
	Node string
	// Behaviors are the behaviors that may start, each with its lease.
	Behaviors []BehaviorLease
	// Reserve returns how many tasks may start, reserving their slots on
	// the node. It is called at most once per call of the store, from the
	// caller's goroutine. Nil starts none.
	Reserve func() int
	// HandOver are claims that a finish makes in its transaction once
	// its completions are recorded, for the slots of a cap that their
	// runs freed on Node (a per-node MaxConcurrency, a group key's cap, a
	// cluster cap): each names one behavior and claims as a claim of the
	// same request would, under the same rules (a claim under flow
	// control counts the running tasks after the finish's writes), at
	// most its Limit. Its Leases are drawn by the node, as a claim's, so
	// that ReleaseClaim can give back what it took when the finish's
	// answer is lost. Independent of Reserve and Behaviors.
	HandOver []ClaimRequest
	// HandedOver is called once the finish's transaction committed, from
	// the caller's goroutine, with the tasks each claim of HandOver took
	// (by its index; none is called for a claim the finish did not make)
	// and what a claim under flow control held back.
	HandedOver func(i int, claimed []Claimed, held FlowHeld)
}

// Renewal extends a run's lease by Duration from the database's now().
type Renewal struct {
	LeaseRef
	Duration time.Duration
}

// Completion is the end of a run.
type Completion struct {
	LeaseRef
	// Status is StatusSuccess or StatusFailure; for a snooze it is
	// StatusScheduled.
	Status api.Status
	Result json.RawMessage
	Error  *api.TaskError
	// Again schedules the task to run again after Delay (recurring task,
	// retry, snooze); otherwise it is finished for good.
	Again bool
	Delay time.Duration
	// HasParent tells that the task is a child: its final end counts
	// against its parent's pending children.
	HasParent bool
	// WaitChildren parks the task until its last pending child finishes,
	// or Delay passes; Status is then StatusScheduled.
	WaitChildren bool
	// WaitSignal parks the task (Again, Status StatusScheduled) until a
	// message of this topic is sent to it, or Delay passes; at once when
	// one is waiting already.
	WaitSignal string
	// Consumed are the Seq of the messages the run received
	// (api.Signal): recorded as consumed with the completion.
	Consumed []int64
	// WaitTasks tells that the run registered a wait on tasks
	// (TaskWaits.WaitTasks): the task sleeps (Again, Status
	// StatusScheduled) until they all ended, or Delay passes; at once
	// when they all ended before the completion is recorded.
	WaitTasks bool
}

// Store is what the engine needs from its database. Implementations are
// safe for concurrent use.
type Store interface {
	Limits
	Workflows
	TaskWaits

	// Warm opens connections until the pool holds at least n (no more
	// than its size), in parallel, so that a starting server's first
	// statements, which go out side by side (claims, the record of the
	// first runs, submits), do not each wait for a connection's set-up: a
	// new session's first statements cost tens of milliseconds. Best
	// effort: a connection it cannot open is left to the pool.
	Warm(ctx context.Context, n int)
	// Submit stores tasks in one statement, merging each into an existing
	// task of its id (see api.Tasks.Submit). The result has one entry per
	// task, in order.
	Submit(ctx context.Context, tasks []NewTask) ([]api.Submission, error)
	// SubmitStart is Submit on a server node that starts some of the new
	// tasks there at once, without a claim. A task with StartLease set
	// starts when the statement creates it (an existing task of its id
	// follows Submit's rules and is not started), it has no Delay, its
	// behavior is not paused, its group key is not held, and no claim
	// hint of its behavior that is due waits with the same or a lower
	// priority number (a local start never jumps a task the claimers
	// would take before it). Such a task is stored running under a fresh
	// lease for node, as a claim stores it (attempt 1, one lease row per
	// behavior and statement, StartLease long unless an operator set the
	// behavior's lease), with its creation (scheduled) and its running
	// state in the change feed, both from the statement, and no claim
	// hint, and is returned in started, in the order of tasks.
	// Every other task is stored as Submit stores it.
	SubmitStart(ctx context.Context, node string, tasks []NewTask) (subs []api.Submission, started []Claimed, err error)
	// SubmitCombined submits t, merging its params into those of a still
	// scheduled task of the same id with combine, under a row lock. A
	// debounced t (NewTask.Debounce) is stored as api.Debounce says, its
	// params merged with combine into those of a task waiting for its next
	// run, or replacing them when combine is nil.
	SubmitCombined(ctx context.Context, t NewTask, combine func(persisted json.RawMessage) (json.RawMessage, error)) (api.Submission, error)
	// SubmitTx is Submit in the caller's transaction: the tasks exist, and
	// the claimers are notified, only once tx commits.
	SubmitTx(ctx context.Context, tx pgx.Tx, tasks []NewTask) ([]api.Submission, error)
	// SubmitCombinedTx is SubmitCombined in the caller's transaction.
	SubmitCombinedTx(ctx context.Context, tx pgx.Tx, t NewTask, combine func(persisted json.RawMessage) (json.RawMessage, error)) (api.Submission, error)
	// Get returns a task or api.ErrNotFound.
	Get(ctx context.Context, id api.TaskID) (api.Task, error)
	// Attempts returns the failed runs recorded for task id, by attempt:
	// those of its current attempts and any left from before its attempts
	// started over (see api.Task.Attempts for which to show). None for a
	// task that does not exist.
	Attempts(ctx context.Context, id api.TaskID) ([]api.Attempt, error)
	// MarkAwaited sets the task's awaited flag and returns its state as of
	// that write, or api.ErrNotFound. A task finished for good is not
	// written (its finish notified or not already) and is returned as it
	// is.
	MarkAwaited(ctx context.Context, id api.TaskID) (api.Task, error)
	// List returns a page of tasks.
	List(ctx context.Context, f api.Filter) (api.Page, error)

	// Claim takes due tasks for a node, issuing a fresh lease for each.
	Claim(ctx context.Context, req ClaimRequest) ([]Claimed, error)
	// Renew extends leases in one statement and returns the ids whose lease
	// still held. Runs claimed by one claim statement share a lease: renewing
	// one renews all of them.
	Renew(ctx context.Context, rs []Renewal) (map[api.TaskID]bool, error)
	// ReleaseLeases drops leases none of whose runs is left on the node.
	// Only the node that holds them calls it. A lease under which the
	// database still shows a task running (a failover lost the end the
	// node recorded) is kept, so that it expires and the task is taken
	// over.
	ReleaseLeases(ctx context.Context, leases [][16]byte) error
	// ReleaseClaim gives back what a claim of req took under req.Leases,
	// due at once in its place in the queue, without counting the
	// attempt, and spends those leases: a claim with them that has not
	// committed yet never does. The node calls it when a claim failed
	// and may have committed all the same (its answer was lost, or
	// outran its deadline), so that its tasks do not wait for the leases
	// to expire.
	ReleaseClaim(ctx context.Context, req ClaimRequest) error
	// Takeover drops up to limit expired leases and makes their tasks
	// that still run under them due again. It returns how many leases and
	// tasks it took over. It never waits for a lock: a task whose row
	// another transaction holds is skipped, and its lease kept for a later
	// call.
	Takeover(ctx context.Context, limit int) (leases, tasks int, err error)
	// Finish records completions in one statement and returns, for each,
	// whether its lease still held (false: api.ErrHalt for that run). A
	// completion whose row cannot be written is reported false too, and
	// never keeps the others of its batch from being recorded. A batch
	// that makes a task due at once (resubmitted while it ran, run again
	// without a delay) notifies ChannelDue, so that claimers need not wait
	// for their poll.
	Finish(ctx context.Context, cs []Completion) ([]bool, error)
	// FinishStart is Finish on a server node that starts there, in the
	// same transaction, workflow nodes the completions make ready, when
	// start.Reserve (asked once, when a statement that may start some is
	// about to run; never when none can) returns room for every dependent
	// the statement's ended nodes have: then each that runs, of
	// start.Behaviors, starts when a claim of the node could take it now
	// (its behavior not paused nor capped at runtime, its group key not
	// held, it spends no rate limit, its workflow is not held, and no due
	// claim hint of its behavior waits with the same or a lower priority
	// number). A wider fan-out is left to the claimers of every node,
	// which take it in priority order. Those started start as a claim
	// starts them, under one lease per behavior, and are returned in
	// started; the others become due as Finish makes them. On an error,
	// started still lists the tasks a part of the batch that committed
	// started. The claims of start.HandOver are made once per call, in
	// the transaction of the first part of the batch recorded without a
	// completion of a child or one that sleeps on a signal; a call with
	// no such part makes none (nor calls HandedOver), and a call that
	// returns an error may have made them. A zero start is Finish.
	FinishStart(ctx context.Context, cs []Completion, start LocalStart) (held []bool, started []Claimed, err error)
	// Checkpoint stores a run's progress. With a non-nil tx it runs inside
	// it. With keep (spi.Policy.KeepSteps) the progress is also kept as
	// the task's next step, in the same statement. The messages of the
	// task whose Seq consumed holds are recorded as consumed with it. It
	// returns api.ErrHalt, and writes nothing, when the lease no longer
	// holds.
	Checkpoint(ctx context.Context, tx pgx.Tx, r LeaseRef, progress json.RawMessage, keep bool, consumed []int64) error
	// Steps returns the steps kept of task id, by number; none for a task
	// that does not exist.
	Steps(ctx context.Context, id api.TaskID) ([]api.Step, error)
	// LastStep returns the number of the last step kept of task id: 0
	// when it has none or does not exist.
	LastStep(ctx context.Context, id api.TaskID) (int, error)
	// Rewind makes a task that finished for good due at once with the
	// progress of its step, a fresh count of attempts, and no steps after
	// it; see api.Operator.
	Rewind(ctx context.Context, id api.TaskID, step int) error
	// Fork stores newID, a copy of task id started from its step; see
	// api.Operator.
	Fork(ctx context.Context, id api.TaskID, step int, newID api.TaskID) (api.Submission, error)
	// SetPriority changes the priority of the running task r, fenced by
	// its lease: it returns api.ErrHalt when the lease no longer holds.
	// The priority orders the task's next claim (after a snooze, a wait
	// or a retry).
	SetPriority(ctx context.Context, r LeaseRef, priority int) error
	// SetEvent sets the event key of the running task r to value, fenced
	// by its lease (api.ErrHalt when it no longer holds), in tx when tx is
	// not nil, and notifies ChannelFinished with the task's id.
	SetEvent(ctx context.Context, tx pgx.Tx, r LeaseRef, key string, value json.RawMessage) error
	// Events returns the events of task id, in key order; only the one of
	// key when key is not empty.
	Events(ctx context.Context, id api.TaskID, key string) ([]api.TaskEvent, error)
	// Signal stores messages for tasks (see api.Signals.Signal), in tx
	// when tx is not nil and otherwise in a transaction of its own, and
	// makes each task that sleeps on the topic of one of its messages
	// due. A task's messages are stored in the order of sigs. Each
	// message is decided on its own: refused[i] wraps api.ErrNotFound
	// when the task of sigs[i] does not exist and api.ErrConflict when it
	// finished for good (unless opts.Reopen reopens it) or is a
	// workflow's own task, and is nil when the message was stored or the
	// task has one with its key already (the first of sigs with a key is
	// the one stored). woke reports that a task was made due now (the
	// statement notified the claimers). err is the statement's error:
	// nothing was stored.
	Signal(ctx context.Context, tx pgx.Tx, sigs []NewSignal, opts SignalOptions) (refused []error, woke bool, err error)
	// Receive returns the oldest message of topic for task id that no run
	// consumed and whose Seq is over after; false when there is none.
	Receive(ctx context.Context, id api.TaskID, topic string, after int64) (api.Signal, bool, error)
	// Signals returns the messages of task id that no run consumed,
	// oldest first.
	Signals(ctx context.Context, id api.TaskID) ([]api.Signal, error)
	// Unclaim gives running tasks back, due at once, without counting the
	// attempt (a graceful stop, a run its node cut off). A task given back
	// keeps its place in the queue: it is due when it was due as claimed,
	// as after a takeover, so that a backlog that came since does not
	// delay it. With behind it is due now instead, behind the tasks that
	// wait (a rotation's stop).
	Unclaim(ctx context.Context, refs []LeaseRef, behind bool) error
	// Postpone is Unclaim for runs their node cannot begin (a task of a
	// newer version of its behavior): the tasks are due after delay, so
	// that the node does not claim them straight back.
	Postpone(ctx context.Context, refs []LeaseRef, delay time.Duration) error
	// Spawn submits children of the running task parent, fenced by its
	// lease: a stale parent spawns nothing and gets api.ErrHalt. Children
	// created by the call count as the parent's pending children.
	Spawn(ctx context.Context, parent LeaseRef, tasks []NewTask) ([]api.Submission, error)

	// Remove deletes a task. A running task's runner gets api.ErrHalt at
	// its next write. It returns the removed task's state.
	Remove(ctx context.Context, id api.TaskID) (api.Task, error)
	// Hold keeps a scheduled task from being claimed; api.ErrConflict for
	// a task that is not scheduled (or retrying).
	Hold(ctx context.Context, id api.TaskID) error
	// Release makes a held task due at once; api.ErrConflict if not held.
	Release(ctx context.Context, id api.TaskID) error
	// Retry schedules a task that failed for good to run again at once,
	// with a fresh count of attempts; api.ErrConflict otherwise.
	Retry(ctx context.Context, id api.TaskID) error
	// Fail ends a task that waits to run (scheduled, held, or due again
	// after a run) as failed for good with e, counts it off its parent's
	// pending children, records the change, counts it in the history as a
	// failure not retried, and wakes its awaiters. A running task is
	// api.ErrConflict: its run owns its outcome. A task that finished for
	// good is api.ErrConflict too.
	Fail(ctx context.Context, id api.TaskID, e *api.TaskError) error
	// HoldGroup keeps every task of a group key from being claimed.
	HoldGroup(ctx context.Context, key string) error
	// ReleaseGroup lifts a group hold.
	ReleaseGroup(ctx context.Context, key string) error
	// HeldGroups lists the held group keys.
	HeldGroups(ctx context.Context) ([]string, error)
	// SetBehavior changes a behavior's runtime settings for all nodes.
	SetBehavior(ctx context.Context, b BehaviorSettings) error
	// Behaviors lists the behaviors with runtime settings.
	Behaviors(ctx context.Context) ([]BehaviorSettings, error)
	// PendingCount counts tasks of behavior due within lookAhead (not
	// running, not held).
	PendingCount(ctx context.Context, behavior api.BehaviorID, lookAhead time.Duration) (int, error)

	// Changes reads the change feed after the cursor f.Since and returns
	// the changes in order with the cursor to read after them.
	Changes(ctx context.Context, f ChangeFilter) ([]api.Event, int64, error)
	// RecentChanges returns the latest limit changes, newest first, for a
	// view of recent activity.
	RecentChanges(ctx context.Context, limit int) ([]api.Event, error)
	// FeedHead returns the cursor a new reader starts at: it sees every
	// change that commits after the call.
	FeedHead(ctx context.Context) (int64, error)
	// AckFeed registers or renews the named feed consumer, at cursor.
	AckFeed(ctx context.Context, consumer string, cursor int64) error
	// FeedConsumers lists the feed consumers.
	FeedConsumers(ctx context.Context) ([]FeedConsumer, error)
	// DeleteFinished deletes up to Limit tasks of a behavior, without a
	// retention of their own, that finished for good with a status longer
	// ago than OlderThan, and returns how many it deleted. It skips locked
	// rows, so it never waits.
	DeleteFinished(ctx context.Context, p DeleteFinishedParams) (int, error)
	// DeleteExpired deletes up to limit tasks with a retention of their
	// own (NewTask.Retention) that finished for good longer ago than it,
	// whatever their behavior, and returns how many it deleted of each
	// behavior and status ("behavior/status"). It skips locked rows.
	DeleteExpired(ctx context.Context, limit int) (map[string]int, error)
	// SetProgress replaces the progress of a task that is not running, if
	// its progress is still old and its status one of statuses; see
	// api.Operator.
	SetProgress(ctx context.Context, id api.TaskID, old, progress json.RawMessage, statuses []api.Status) error
	// CountChildren counts the children of behavior of the parents; see
	// api.Operator.
	CountChildren(ctx context.Context, parents []api.TaskID, behavior api.BehaviorID, progressField string) ([]api.ChildCount, error)
	// PutSchedules stores schedules, replacing those of the same name and
	// origin (registered by a behavior, or added at runtime) and keeping
	// when they last fired. A name taken by a schedule of the other origin
	// is api.ErrConflict.
	PutSchedules(ctx context.Context, ss []api.Schedule, registered bool) error
	// DeleteSchedule deletes a schedule; api.ErrNotFound if there is none.
	DeleteSchedule(ctx context.Context, name string) error
	// Schedules lists the schedules by name, with the database's now().
	Schedules(ctx context.Context) ([]Schedule, time.Time, error)
	// FireSchedule fires one tick of a schedule: in one transaction, it
	// moves the schedule's last tick from last to tick, and if that
	// compare-and-set held, submits task (if not nil). It reports whether
	// it fired; false means another node fired that tick, or holds the
	// schedule in its own firing (it does not wait for it), or the
	// schedule is gone.
	FireSchedule(ctx context.Context, name string, last *time.Time, tick time.Time, task *NewTask) (bool, error)
	// Maintain drops dead feed consumers and nodes and trims the feed.
	Maintain(ctx context.Context, p MaintainParams) (MaintainResult, error)

	// RegisterNode records a node as started.
	RegisterNode(ctx context.Context, n Node) error
	// HeartbeatNode renews a node's heartbeat and records its health;
	// api.ErrNotFound if the node
	// is not registered (another node dropped it as dead).
	HeartbeatNode(ctx context.Context, id string, health NodeHealth) error
	// DeregisterNode removes a node.
	DeregisterNode(ctx context.Context, id string) error
	// Nodes lists the registered nodes, with the age of their heartbeat
	// by the database's clock.
	Nodes(ctx context.Context) ([]Node, error)
	// RunningOn counts the running tasks whose lease each of nodes holds;
	// a node with none is left out.
	RunningOn(ctx context.Context, nodes []string) ([]NodeRunning, error)
	// Stats returns a consistent snapshot of task counts for operators.
	Stats(ctx context.Context) (Stats, error)
	// QueueLag returns how long the longest-waiting due task (not running,
	// not held) has been due; zero when none is.
	QueueLag(ctx context.Context) (time.Duration, error)
	// MetricStats is Stats for the metrics, cheaper on a large backlog:
	// the counts per behavior and status, and the backlog counted from the
	// claim hints without checking each against its task (a hint made
	// stale by a later change counts until a claim drops it). Running is
	// empty.
	MetricStats(ctx context.Context) (Stats, error)
	// RecordHistory adds r's run ends to the history's current bucket (of
	// api.HistoryBucket, by the database clock). With r.Sample set, and
	// when no node has sampled the current 10-second slot yet, it then
	// samples the due backlog and queue lag of every behavior, keeping in
	// the bucket the largest of its samples, and deletes the points older
	// than api.HistoryRetention; it reports whether it took the sample.
	RecordHistory(ctx context.Context, r HistoryRecord) (sampled bool, err error)
	// History reads the history of the last window.
	History(ctx context.Context, window time.Duration) (api.History, error)

	// Listen calls fn for every notification on channels until ctx ends,
	// reconnecting after errors. After each (re)connect it calls fn with
	// an empty payload on every channel, since notifications sent while it
	// was away are lost. It never gives up: a connection that breaks or
	// stops answering is made again. onState, if not nil, is called with
	// each failure and with nil each time it listens again.
	Listen(ctx context.Context, channels []string, fn func(channel, payload string), onState func(error)) error
	// Notify sends a notification.
	Notify(ctx context.Context, channel, payload string) error
}

// Schedule is a stored schedule.
type Schedule struct {
	api.Schedule
	Registered bool
	// LastTick is the tick that fired last; nil before the first.
	LastTick  *time.Time
	CreatedAt time.Time
}
