package spi

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"time"

	"github.com/stinthq/stint/api"
)

// Dedup says what a submit does to an existing task of the same id.
type Dedup int

const (
	// DedupResubmit follows couch_jobs' add: a scheduled task gets its params
	// combined and its due time updated, a running task is flagged to run
	// again when it ends, a finished task is scheduled again. The default.
	DedupResubmit Dedup = iota
	// DedupShare follows Polaris: every submission of an id shares the one
	// task and its one result; a submit of an existing id changes nothing.
	DedupShare
)

// Policy tunes how a behavior's tasks run. Zero fields take the defaults.
type Policy struct {
	// Lease is how long a claim or renewal holds a task; a task whose node
	// stops renewing is taken over this long after the last renewal.
	// Defaults to 30 seconds; at least 1 second.
	Lease time.Duration
	// MaxConcurrency caps the tasks of this behavior one node runs at once.
	// Zero leaves only the node's worker limit.
	MaxConcurrency int
	// GroupConcurrency caps the running tasks of this behavior per group
	// key across all nodes (e.g. one ingest job per collection at a time).
	// Zero means no cap. Claims of a capped behavior take a short
	// transaction with a lock per key, so leave it zero where not needed.
	GroupConcurrency int
	// Priority is the default priority of new tasks; lower runs first.
	// Zero means the default, 5.
	Priority int
	// MaxAttempts is how many runs a failing task gets before it fails for
	// good. Defaults to 10.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the retry delay, which doubles with
	// every consecutive failure and is jittered to 75-100%. Default to
	// 1 second and 1 hour.
	BackoffMin, BackoffMax time.Duration
	// Dedup is what a submit of an existing id does. Defaults to
	// DedupResubmit.
	Dedup Dedup
	// MaxParamsBytes caps the size of the JSON params. Defaults to 1 MiB.
	MaxParamsBytes int
	// Retention is how long a task that succeeded for good is kept before
	// the cleanup behavior deletes it. Defaults to 7 days.
	Retention time.Duration
	// FailureRetention is how long a task that failed for good is kept.
	// Defaults to 30 days.
	FailureRetention time.Duration
	// Timeout bounds a run: its ctx is cancelled, with a cause matching
	// ErrTimeout, this long after the run started. A run that then returns
	// anything but a result fails with a retryable api.TaskError of code
	// "timeout", counted as an attempt and retried with backoff like any
	// failure (a result returned after the deadline is kept: the work was
	// done). A run that does not return once its ctx ended is no longer
	// renewed: its task is taken over after the lease. Zero, the default,
	// sets no limit: replications and other
	// long-running tasks run for days, and a run that hangs is better
	// caught by ActivityTimeout, which does not depend on how long the work
	// takes.
	Timeout time.Duration
	// ActivityTimeout takes the task away from a run that shows no sign of
	// progress (no Checkpoint, CheckpointTx or Heartbeat) for this long
	// since it started or last did (couch_jobs' activity timeout): the
	// node stops renewing the run's lease and gives the task back, due at
	// once for any node and resuming from its last checkpoint, and cancels
	// the run's ctx with a cause matching ErrInactive (and api.ErrHalt).
	// Like a rotation stop, it records no failure and does not count the
	// attempt; set Timeout too to bound a run that hangs every time. The
	// node's slot is given back when Run returns. Zero, the default, turns
	// it off: behaviors that do not checkpoint would lose every run that
	// takes longer than the timeout.
	ActivityTimeout time.Duration
	// ClusterConcurrency caps the running tasks of this behavior across
	// all nodes. Zero means no cap. An operator may override it at runtime
	// (api.Limits.SetConcurrencyLimit with no key).
	ClusterConcurrency int
	// FairShare makes claims serve the group keys with due tasks in turn
	// (weighted by api.ConcurrencyLimit.Weight) instead of in strict
	// priority and due order, so that one key's backlog does not delay
	// another key's tasks. Its claims take a short transaction, as
	// GroupConcurrency's do. Off by default.
	FairShare bool
	// RateLimits declares the rate limits this behavior's tasks name
	// (RateLimiter) with their defaults: a declared limit that the
	// database does not hold yet is stored with these values by the first
	// submit that names it, and operators change it at runtime from there.
	// A submit naming a limit neither stored nor declared is refused.
	RateLimits []api.RateLimit
	// Version is the behavior's version: a release raises it when its
	// params or results change so that the release before cannot read
	// them (a field added, a meaning changed). Each task records the
	// version of the behavior that submitted it, and a node runs a task
	// only when its own version of the behavior is the task's or newer:
	// during a rolling deploy, a node of the old release gives a newer
	// task back, without counting an attempt, for a node of the new one.
	// Zero, the default, is the version of a behavior that never set one.
	Version int
	// KeepSteps keeps every checkpoint of the behavior's runs as a
	// numbered step of its task (api.Task.Steps, with when it was stored),
	// instead of only the last one, so that an operator may run a finished
	// task again from a step (api.Operator.Rewind) or start a copy there
	// (api.Operator.Fork). It costs a row per checkpoint, kept as long as
	// the task, and a read of the step number as a run that resumes from
	// one begins (for its span's stint.step attribute). Off by default.
	KeepSteps bool
	// ReopenOnSignal makes a signal (api.Signals) to a task of this
	// behavior that finished for good, in success or failure, schedule it
	// again at once, as a resubmit of a finished task does: its status is
	// scheduled, its attempts and errors are reset to 0, executed_at and
	// finished_at are cleared, and its result or error is kept until the
	// next run ends. The message is stored, and the new run receives it.
	// A workflow's node, a workflow's own task and a child task (one with
	// a parent, which counted its end) are never reopened: retry them.
	// Only a client whose Registry holds the behavior with this policy
	// reopens (the one that sends the signal). Off by default: a signal to
	// a finished task is refused with api.ErrConflict.
	ReopenOnSignal bool
	// Rotation, when set, makes the behavior's tasks preemptible: each node
	// runs at most Rotation.MaxRunning of them and, while others wait,
	// stops the longest-running ones in turn (the CouchDB replicator's
	// scheduler). Nil runs tasks to their end.
	Rotation *Rotation
}

// Rotation shares a node's slots among more long-running tasks than it
// can run at once. Every Interval (plus up to a third of it as jitter) the
// node stops the oldest runs that ran at least MinRunTime, as many as
// tasks wait (due and unclaimed) beyond its free slots and at most
// MaxChurn, and starts as many waiting tasks in their place as soon as the
// stopped runs returned: the node keeps MaxRunning tasks running, and at
// most MaxChurn of its slots are between a stop and a start (free slots
// count as such). Free slots are filled at once, whatever the interval. A
// stopped run's context is cancelled with a cause matching ErrPreempted;
// its task is due again at once, behind the tasks that waited, without an
// attempt counted, and resumes from its last checkpoint. Zero fields take
// the replicator's defaults.
type Rotation struct {
	// MaxRunning caps the running tasks of the behavior per node.
	// Defaults to 500 (max_jobs).
	MaxRunning int
	// MaxChurn caps the runs stopped per interval, each of which is
	// replaced by a waiting task. Defaults to 100.
	MaxChurn int
	// Interval is the time between rotations. Defaults to 15 seconds.
	Interval time.Duration
	// MinRunTime protects a run from being stopped before it ran this
	// long. Defaults to 60 seconds.
	MinRunTime time.Duration
}

// ErrPreempted is the cause of a run's context cancelled by rotation.
var ErrPreempted = errors.New("stint: preempted by rotation")

// ErrTimeout is the cause of a run's context cancelled by Policy.Timeout.
var ErrTimeout = errors.New("stint: run timed out")

// ErrInactive is the cause of a run's context cancelled by
// Policy.ActivityTimeout; the cause matches api.ErrHalt too.
var ErrInactive = errors.New("stint: no activity within the activity timeout")

// WithDefaults returns r with zero fields set to their defaults.
func (r Rotation) WithDefaults() Rotation {
	if r.MaxRunning <= 0 {
		r.MaxRunning = 500
	}
	if r.MaxChurn <= 0 {
		r.MaxChurn = 100
	}
	if r.Interval <= 0 {
		r.Interval = 15 * time.Second
	}
	if r.MinRunTime <= 0 {
		r.MinRunTime = 60 * time.Second
	}
	return r
}

// Policy defaults.
const (
	DefaultLease          = 30 * time.Second
	DefaultPriority       = 5
	DefaultMaxAttempts    = 10
	DefaultBackoffMin     = time.Second
	DefaultBackoffMax     = time.Hour
	DefaultMaxParamsBytes = 1 << 20
)

// WithDefaults returns p with zero fields set to their defaults.
func (p Policy) WithDefaults() Policy {
	if p.Lease <= 0 {
		p.Lease = DefaultLease
	}
	if p.Lease < time.Second {
		p.Lease = time.Second
	}
	if p.Priority == 0 {
		p.Priority = DefaultPriority
	}
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.BackoffMin <= 0 {
		p.BackoffMin = DefaultBackoffMin
	}
	if p.BackoffMax <= 0 {
		p.BackoffMax = DefaultBackoffMax
	}
	if p.BackoffMax < p.BackoffMin {
		p.BackoffMax = p.BackoffMin
	}
	if p.MaxParamsBytes <= 0 {
		p.MaxParamsBytes = DefaultMaxParamsBytes
	}
	if p.Retention <= 0 {
		p.Retention = 7 * 24 * time.Hour
	}
	if p.FailureRetention <= 0 {
		p.FailureRetention = 30 * 24 * time.Hour
	}
	p.Timeout = max(p.Timeout, 0)
	p.ActivityTimeout = max(p.ActivityTimeout, 0)
	if p.Rotation != nil {
		r := p.Rotation.WithDefaults()
		p.Rotation = &r
	}
	return p
}

// Backoff returns the delay before retry number failures (1 for the first
// failure): min * 2^(failures-1), capped at max, jittered to 75-100%.
func Backoff(min, max time.Duration, failures int) time.Duration {
	exp := math.Min(float64(failures-1), 62)
	d := float64(min) * math.Pow(2, math.Max(exp, 0))
	if d > float64(max) {
		d = float64(max)
	}
	return time.Duration(d * (0.75 + 0.25*rand.Float64()))
}

// Sleep waits d, or until ctx ends: then it returns the context's cause.
// Behaviors that wait between steps use it so that a removal, a lost lease
// or a stop ends the wait at once.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
