package impl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stinthq/stint/store"
)

// Giving tasks back: the runs a node ends without recording an end (a
// stop, a rotation, a run begun too late, a task of a newer release) hand
// their tasks back to the claimers, without counting an attempt.

// newerDelay is how long a task that a node left for a newer release
// waits before it is due again, for any node: long enough that an old node
// does not spin on it, short enough that a new node that was busy or not
// up yet takes it soon.
const newerDelay = 3 * time.Second

// leaveForNewer gives back the task of r, a run this node cannot begin:
// its task was submitted by a newer release of its behavior (a newer
// version, or params with a field this release does not know, decodeErr).
// It is due again after newerDelay, without counting the attempt, and the
// node says so once per behavior and version in its log.
func (s *Server) leaveForNewer(r *run, decodeErr error) {
	key := fmt.Sprintf("%s@%d", r.claimed.Behavior, r.claimed.Version)
	if _, seen := s.newer.LoadOrStore(key, true); !seen {
		why := fmt.Sprintf("it is of version %d and this node runs version %d", r.claimed.Version, r.reg.Policy.Version)
		if r.claimed.Version <= r.reg.Policy.Version {
			why = fmt.Sprintf("its params do not decode here (%v)", decodeErr)
		}
		s.log.Warn("stint: a task of a newer release of its behavior is left for a node that runs it; "+
			"this node says so once per behavior and version", "behavior", r.claimed.Behavior, "task", r.claimed.ID, "why", why)
	}
	r.cancel(errNewerRelease)
	s.handBack(func(ctx context.Context, refs []store.LeaseRef) error { return s.st.Postpone(ctx, refs, newerDelay) }, r)
}

// errNewerRelease ends a run that leaveForNewer gave back.
var errNewerRelease = errors.New("stint: the task is of a newer release of its behavior")

// giveBack ends runs without recording an end: their tasks are given back
// under their leases, due at once (in their place in the queue, or behind
// the tasks that wait: see store.Store.Unclaim), and their slots are
// freed.
func (s *Server) giveBack(behind bool, runs ...*run) {
	s.handBack(func(ctx context.Context, refs []store.LeaseRef) error { return s.st.Unclaim(ctx, refs, behind) }, runs...)
}

// handBack ends runs without recording an end, giving their tasks back
// with unclaim, and frees their slots.
func (s *Server) handBack(unclaim func(context.Context, []store.LeaseRef) error, runs ...*run) {
	refs := make([]store.LeaseRef, len(runs))
	for i, r := range runs {
		refs[i] = r.claimed.LeaseRef
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := unclaim(ctx, refs)
	if err != nil && !s.inc.failed("unclaim", err) {
		s.log.Warn("stint: unclaim failed; the tasks are taken over after their lease", "tasks", len(refs), "first", refs[0].ID, "err", err)
	}
	// Only now: a rotation must not start the next task while the stopped
	// one still shows as running. Then start the next one: a claimer that
	// found no free slot waits for a wake-up.
	for _, r := range runs {
		s.freeSlot(r)
	}
	s.wakeClaimer()
	for _, r := range runs {
		s.endRun(r, err == nil)
	}
}
