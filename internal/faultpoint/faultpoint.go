// Package faultpoint names the points of stint's work where the fault
// suite stops a process on purpose: inside a transaction that holds what
// other nodes wait for (a claim's turn, a schedule's row, the migration
// lock), so that a test can freeze a node there deterministically. In a
// process that sets no hook, reaching a point costs one atomic load.
package faultpoint

import "sync/atomic"

// The points, each reached while the process holds what its doc says.
const (
	// FlowClaim: inside a claim under flow control, holding its
	// behavior's turn (the exclusive advisory lock the other nodes'
	// claims of the behavior wait for).
	FlowClaim = "claim.flow"
	// PlainClaim: a plain claim was sent (one round trip, its
	// transaction implicit) and its result is not read yet.
	PlainClaim = "claim.plain"
	// ScheduleFire: inside the firing of a schedule's tick, holding the
	// schedule's row.
	ScheduleFire = "schedule.fire"
	// RateLimitSet: inside the change of a rate limit, holding its row,
	// which the claims that spend it share-lock.
	RateLimitSet = "limits.rate"
	// Migrate: inside a migration's transaction, its statements run and
	// not committed, holding the migration lock and the locks its
	// statements took.
	Migrate = "migrate"
)

var hook atomic.Pointer[func(point string)]

// Set makes fn run whenever a point is reached (nil: nothing runs). fn
// runs on the goroutine that reached the point, which waits for it.
func Set(fn func(point string)) {
	if fn == nil {
		hook.Store(nil)
		return
	}
	hook.Store(&fn)
}

// Reach runs the hook, if one is set, for point.
func Reach(point string) {
	if fn := hook.Load(); fn != nil {
		(*fn)(point)
	}
}
