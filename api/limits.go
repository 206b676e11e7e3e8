package api

import (
	"context"
	"time"
)

// Limits is flow control across the cluster, read and changed at runtime:
// named rate limits that tasks consume when they start, and caps on how
// many tasks of a behavior run at once, per group key or in all. Every
// node enforces what the database holds, in the same statement that
// starts a task, so no interleaving of nodes starts more than a limit
// allows. A task held back by a limit waits: it neither fails nor counts
// an attempt, and its Task.Waiting says what it waits on.
type Limits interface {
	// SetRateLimit stores a rate limit, or changes the one of its name;
	// the change applies to the next start. Each key keeps the units it
	// spent, and the tasks the limit holds back are weighed again at once
	// under the new values. Bad values are an error wrapping ErrInvalid,
	// and nothing is stored.
	SetRateLimit(ctx context.Context, l RateLimit) error
	// RemoveRateLimit deletes a rate limit and the state of its keys;
	// ErrNotFound if there is none. Tasks that name it start unlimited,
	// those it held back at once.
	RemoveRateLimit(ctx context.Context, name string) error
	// RateLimits lists the rate limits by name, with their use.
	RateLimits(ctx context.Context) ([]RateLimitInfo, error)
	// SetConcurrencyLimit stores a cap on running tasks (of a group key of
	// a behavior, or of the behavior as a whole), or changes it; the
	// change applies to the next start (tasks running over a lowered cap
	// run on). Bad values are an error wrapping ErrInvalid, and nothing is
	// stored; so is a behavior unknown to the caller and to every live
	// node (ErrUnknownBehavior) unless l.Force is set.
	SetConcurrencyLimit(ctx context.Context, l ConcurrencyLimit) error
	// RemoveConcurrencyLimit deletes the cap set for behavior and key (key
	// empty: the behavior's cluster-wide cap); ErrNotFound if there is
	// none. The behavior's policy applies again.
	RemoveConcurrencyLimit(ctx context.Context, behavior BehaviorID, key string) error
	// ConcurrencyLimits lists the caps set at runtime, with their running
	// and waiting tasks.
	ConcurrencyLimits(ctx context.Context) ([]ConcurrencyInfo, error)
}

// RateLimit is a named rate limit, shared by every behavior whose tasks
// name it (spi.RateLimiter). Each key of the limit (a customer, an
// external API: whatever the task names) has its own budget.
//
// The rule is a token bucket (in its GCRA form) with a burst of Limit: a
// key's budget refills at Limit units per Period, continuously, up to
// Limit. A start consumes its task's units. So a key idle for a whole
// Period may start Limit units at once, and over any window of length w no
// key starts more than Limit + Limit*w/Period units.
type RateLimit struct {
	// Name identifies the limit: 1 to 128 printable bytes.
	Name string `json:"name"`
	// Limit is the most units a key may start per Period, and its burst.
	// At least 1.
	Limit int64 `json:"limit"`
	// Period is the time over which Limit units refill. At least 1
	// millisecond. In JSON, a duration string such as "1m0s" (a number of
	// nanoseconds is read too).
	Period time.Duration `json:"period"`
}

// RateLimitInfo is a rate limit with its use.
type RateLimitInfo struct {
	RateLimit
	// Keys are the limit's keys that started a task within the last
	// Period, or have tasks waiting, by key.
	Keys []RateKeyInfo `json:"keys,omitempty"`
	// Waiting counts the tasks waiting on this limit, all keys.
	Waiting int `json:"waiting"`
}

// RateKeyInfo is the state of one key of a rate limit.
type RateKeyInfo struct {
	Key string `json:"key"`
	// Used is how many units of the budget are spent (Limit minus what
	// the key may start now).
	Used int64 `json:"used"`
	// NextFree is when the next unit frees up; nil when the budget is
	// full.
	NextFree *time.Time `json:"next_free,omitempty"`
	// Waiting counts this key's tasks waiting on the limit.
	Waiting int `json:"waiting"`
}

// ConcurrencyLimit caps the running tasks of a behavior across all nodes:
// of one group key (Key set: an override of spi.Policy.GroupConcurrency
// for that key), or of all the behavior's tasks (Key empty: the
// cluster-wide cap, an override of spi.Policy.ClusterConcurrency).
type ConcurrencyLimit struct {
	Behavior BehaviorID `json:"behavior"`
	// Key is the group key the cap is for; empty for the behavior as a
	// whole. At most 256 printable bytes.
	Key string `json:"key,omitempty"`
	// Max is the most tasks that may run at once. At least 1; zero on a
	// key keeps the policy's cap and sets only Weight.
	Max int `json:"max"`
	// Weight is the key's share of the claims of a behavior with
	// spi.Policy.FairShare: a key of weight 3 is served three tasks for
	// each task of a key of weight 1. Zero means 1; only on a key.
	Weight int `json:"weight,omitempty"`
	// Force stores the cap for a behavior that neither the caller's
	// registry holds nor any live node runs: one whose nodes are not
	// deployed yet. Without it (the default) such a behavior is refused
	// with ErrUnknownBehavior, as a typo would be. Set only on input.
	Force bool `json:"force,omitempty"`
}

// ConcurrencyInfo is a concurrency cap with its use.
type ConcurrencyInfo struct {
	ConcurrencyLimit
	// Running counts the tasks running under the cap.
	Running int `json:"running"`
	// Waiting counts the due tasks the cap holds back.
	Waiting int `json:"waiting"`
}

// Wait is what a due task waits on before it can start. In JSON it also
// has the field behavior, which Behavior returns.
type Wait struct {
	// Reason is WaitRateLimit, WaitConcurrency, WaitPaused, WaitNoNode,
	// WaitNodesFull, WaitGroupHeld, WaitDependencies or WaitSignal.
	Reason string `json:"reason"`
	// Limit names the rate limit; for the reasons of a behavior
	// (WaitConcurrency, WaitPaused, WaitNoNode, WaitNodesFull) it holds the
	// behavior, which Behavior returns; empty for WaitDependencies.
	Limit string `json:"limit"`
	// Key is the limit's key, the group key or the signal's topic; empty
	// for a cap of the behavior as a whole.
	Key string `json:"key,omitempty"`
	// Until is when the rate limit next admits the task; nil for a cap,
	// which frees when a running task ends.
	Until *time.Time `json:"until,omitempty"`
	// Dependencies names the dependencies a waiting workflow node waits
	// for (Reason WaitDependencies).
	Dependencies []string `json:"dependencies,omitempty"`
	// Detail says more, for a person: for WaitNoNode, which live node runs
	// which behaviors ("node-a runs demo.echo, cleanup", or "no node is
	// live"); for WaitNodesFull, how busy each node that runs the behavior
	// is. Empty for the other reasons.
	Detail string `json:"detail,omitempty"`
	// Version is, for WaitNoNode, the version of the behavior the task
	// needs when live nodes run only older ones (see spi.Policy.Version):
	// the task waits for a node of a newer release. Zero otherwise.
	Version int `json:"version,omitempty"`
}

// Behavior returns the behavior a wait is about: the one whose cap is
// full (WaitConcurrency), which is paused (WaitPaused), which no live node
// runs (WaitNoNode) or whose nodes are full (WaitNodesFull); empty for a
// rate limit and for dependencies.
func (w Wait) Behavior() BehaviorID {
	switch w.Reason {
	case WaitConcurrency, WaitPaused, WaitNoNode, WaitNodesFull:
		return BehaviorID(w.Limit)
	}
	return ""
}

// The reasons of a Wait.
const (
	WaitRateLimit   = "rate_limit"
	WaitConcurrency = "concurrency"
	// WaitDependencies: a workflow node's rule waits for its
	// dependencies to end.
	WaitDependencies = "dependencies"
	// WaitPaused: the task's behavior is paused (on every node).
	WaitPaused = "paused"
	// WaitNoNode: no live node runs the task's behavior, so nothing will
	// claim it until one starts.
	WaitNoNode = "no_node"
	// WaitNodesFull: every live node that runs the task's behavior runs
	// as many tasks as its workers allow.
	WaitNodesFull = "nodes_full"
	// WaitGroupHeld: the task's group key is held (Operator.HoldGroup);
	// Wait.Key names it.
	WaitGroupHeld = "group_held"
	// WaitSignal: the task sleeps until a signal of a topic comes
	// (spi.WaitForSignal), or its longest wait passes; Wait.Key names the
	// topic and Wait.Detail reads "signal <topic>".
	WaitSignal = "signal"
)
