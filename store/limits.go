package store

import (
	"context"
	"time"

	"github.com/stinthq/stint/api"
)

// RateUse is the use a task makes of one rate limit when it starts, as
// its behavior derived it at submit (spi.RateLimiter), validated.
type RateUse struct {
	Limit string `json:"l"`
	Key   string `json:"k,omitempty"`
	Units int64  `json:"u"`
}

// FlowHeld is what a claim under flow control held back by a rate limit.
type FlowHeld struct {
	// Delayed counts the tasks it moved to when their limit admits them.
	Delayed int
	// Wake is how soon the first of them falls due; zero when none.
	Wake time.Duration
	// LeaseDelay is how long after the claim's transaction began the
	// leases of its tasks began, by the database's clock: the time the
	// claim waited for its behavior's turn. A node counts its runs'
	// leases from when it sent the claim plus this, which is never later
	// than the database counts them from.
	LeaseDelay time.Duration
	// Capped is set when a cap across nodes (the behavior's, or a group
	// key's) held tasks back: the claim found it full, or filled it.
	Capped bool
	// Drained is set when the claim took every task the caps admit and
	// left a cap full: another claim of the behavior finds nothing before
	// a slot of it frees, a task falls due or a cap changes.
	Drained bool
}

// Limits is the flow control a store keeps: rate limits, the state of
// their keys, and the caps on running tasks set at runtime. Claims enforce
// them (ClaimRequest); these are the operator's reads and writes.
type Limits interface {
	// SetRateLimit stores a rate limit or changes the one of its name.
	SetRateLimit(ctx context.Context, l api.RateLimit) error
	// RemoveRateLimit deletes a rate limit and the state of its keys;
	// api.ErrNotFound if there is none.
	RemoveRateLimit(ctx context.Context, name string) error
	// RateLimits lists the rate limits by name, with their keys in use and
	// their waiting tasks.
	RateLimits(ctx context.Context) ([]api.RateLimitInfo, error)
	// EnsureRateLimits returns the stored limits of names, first storing
	// those of declared that names lists and the store does not hold. A
	// name neither stored nor declared is absent from the result.
	EnsureRateLimits(ctx context.Context, declared []api.RateLimit, names []string) (map[string]api.RateLimit, error)
	// SetConcurrencyLimit stores a cap (and weight) for a behavior and key
	// ('' for the behavior as a whole), or changes it, and wakes the
	// claimers.
	SetConcurrencyLimit(ctx context.Context, l api.ConcurrencyLimit) error
	// RemoveConcurrencyLimit deletes the cap of behavior and key;
	// api.ErrNotFound if there is none.
	RemoveConcurrencyLimit(ctx context.Context, behavior api.BehaviorID, key string) error
	// ConcurrencyLimits lists the caps set at runtime by behavior and key,
	// with their running and waiting tasks.
	ConcurrencyLimits(ctx context.Context) ([]api.ConcurrencyInfo, error)
	// CappedBehaviors lists the behaviors with a cap set at runtime, of
	// the behavior or of one of its keys: their claims must take the
	// capped path (ClaimRequest.Flow).
	CappedBehaviors(ctx context.Context) ([]api.BehaviorID, error)
	// DueBehaviors returns those of behaviors with a task due within
	// lookAhead: a node need not open a claim under flow control for the
	// others.
	DueBehaviors(ctx context.Context, behaviors []api.BehaviorID, lookAhead time.Duration) ([]api.BehaviorID, error)
	// ClaimFlow is Claim under flow control (a request with
	// ClaimRequest.Limited): it enforces the caps in force and the tasks'
	// rate uses, moves each task a rate limit holds back to when the
	// limit admits it, and returns, besides the claimed tasks, what it
	// held back.
	ClaimFlow(ctx context.Context, req ClaimRequest) ([]Claimed, FlowHeld, error)
	// ConcurrencyWait returns what a due task of behavior with group key
	// waits on when a cap is full: the behavior's cap (runtime, else
	// cluster) or its key's (runtime, else perGroup); nil when neither is.
	ConcurrencyWait(ctx context.Context, behavior api.BehaviorID, key string, cluster, perGroup int) (*api.Wait, error)
}
