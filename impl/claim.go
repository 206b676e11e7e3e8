package impl

// The claim loop: claims sized to the free slots, grouped by how their
// behaviors are claimed, and the slots they reserve and give back.

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// claimLoop claims due tasks while there are free slots and claims find
// some, and waits for a wake-up, a freed slot (when the node is full), the
// end of a run of a behavior at its cap on this node (see freeSlot), the
// return of another claimer's claim that held the slots it needed, or the
// poll interval otherwise. A claim follows one that found tasks even when that one found
// fewer than it asked for: under a stream of submits, whose notifications
// are coalesced to one per client and window, the next tasks are due
// before the next notification.
//
// A wake-up (a submit's notification, a kick when tasks fall due, the
// poll) makes the next claim ask every group; a claim that follows one
// that found tasks leaves out the groups that found nothing lately (see
// activeGroups).
func (s *Server) claimLoop(ctx context.Context, wake <-chan struct{}) {
	poll := time.NewTimer(s.cfg.PollInterval)
	defer poll.Stop()
	failures := 0
	woken := true
	for ctx.Err() == nil {
		select {
		case <-wake:
			woken = true
		default:
		}
		n, full, blocked, err := s.claimOnce(ctx, woken)
		woken = err != nil
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			failures++
			if !s.inc.failed("claim", err) {
				s.log.Warn("stint: claim failed", "err", err, "failures", failures)
			}
			// Backing off no further than the poll interval: a task
			// submitted during an outage starts within it once the
			// database answers again.
			sleep(ctx, spi.Backoff(min(100*time.Millisecond, s.cfg.PollInterval), s.cfg.PollInterval, failures))
			continue
		case full:
			failures = 0
			select {
			case <-ctx.Done():
			case <-s.slotFreed:
				sleep(ctx, s.cfg.FetchCooldown)
			case <-blocked:
			}
			continue
		case n > 0:
			failures = 0
			sleep(ctx, s.cfg.FetchCooldown)
			continue
		}
		failures = 0
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
		poll.Reset(s.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-wake:
			woken = true
		case <-poll.C:
			woken = true
		case <-s.capFreed:
		case <-s.sharedFreed:
			// The runs a claim under a cap across nodes started end
			// together when they take about as long: a pause lets one
			// claim take the slots they free, rather than one claim
			// each, every one a transaction that takes the behavior's
			// turn and counts its runs.
			sleep(ctx, s.cfg.FetchCooldown)
		case <-blocked:
			// Another claimer's claim held the slots a group of this
			// claim needed: the slots it did not fill are free again, and
			// nothing else says so.
		}
	}
}

// claimOnce claims tasks for the free slots. full is set when no slot is
// left. Slots are reserved before a claim statement goes out, so that the
// claimers running side by side never claim more than the free slots.
// woken asks every claim group; see activeGroups. blocked is set when
// another claimer's claims in flight held slots this one needed (its
// groups found no room, or no slot was left): it is closed when one of
// them returns, and with it the slots it did not fill.
func (s *Server) claimOnce(ctx context.Context, woken bool) (n int, full bool, blocked <-chan struct{}, err error) {
	for _, g := range s.dueGroups(ctx, s.activeGroups(s.claimGroups(s.runtimeCaps(ctx)), woken)) {
		g, ok, held := s.reserve(g)
		if !ok {
			blocked = cmp.Or(blocked, held)
			continue
		}
		sent := time.Now()
		// The statement is not cancelled with the claimer: a cancel that
		// reaches the database after the claim committed would leave its
		// tasks claimed with no run, until their lease expired. Stop waits
		// for the claimers, so the runs of a claim that completes start
		// and are stopped as every other run.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(s.minLease, 5*time.Second))
		req := store.ClaimRequest{Node: s.cfg.Node, Behaviors: g.behaviors, Limit: g.limit, LookAhead: s.cfg.LookAhead,
			Leases: drawLeases(len(g.behaviors))}
		var claimed []store.Claimed
		var flow store.FlowHeld
		leased := sent // when the claimed runs' leases began, at the latest
		if g.flow != nil {
			req.PerGroup, req.Cluster, req.FairShare, req.Flow = g.flow.GroupConcurrency, g.flow.ClusterConcurrency, g.flow.FairShare, true
			req.Returned, req.Busy = s.returned(g.behaviors[0].Behavior), s.isFlowBusy(g.behaviors[0].Behavior)
			claimed, flow, err = s.st.ClaimFlow(cctx, req)
			if flow.Capped {
				s.noteCapped(g.behaviors[0].Behavior, true)
			}
			// Tasks a rate limit held back were moved to when it admits
			// them: wake the claimers then, not at the next poll.
			s.kick.kickAfter(flow.Wake)
			s.tel.delayed(ctx, flow.Delayed, g.behaviors[0].Behavior)
			// A claim that waited for its behavior's turn issued its
			// leases after the wait.
			leased = sent.Add(flow.LeaseDelay)
		} else {
			claimed, err = s.st.Claim(cctx, req)
		}
		cancel()
		s.unreserve(g, claimed, err == nil, flow.Drained)
		if err != nil {
			// The claim may have committed all the same: its answer
			// outran the deadline, or the connection broke on the way.
			go s.releaseClaim(req)
			return n, false, nil, err
		}
		s.inc.ok(false)
		s.tel.claimDone(ctx, claimed, time.Since(sent))
		s.startRuns(claimed, leased)
		n += len(claimed)
	}
	s.mu.Lock()
	full = s.slots.free() <= 0
	if full && s.claiming > 0 {
		blocked = s.claimReturned
	}
	s.mu.Unlock()
	return n, full, blocked, nil
}

// dueGroups leaves out of groups the claims under flow control of
// behaviors with nothing due, found in one query for all of them: such a
// claim is a transaction of three round trips. A behavior whose last
// claim found tasks is claimed without asking.
func (s *Server) dueGroups(ctx context.Context, groups []claimGroup) []claimGroup {
	var ask []api.BehaviorID
	s.mu.Lock()
	for _, g := range groups {
		if g.flow != nil && !s.flowBusy[g.behaviors[0].Behavior] {
			ask = append(ask, g.behaviors[0].Behavior)
		}
	}
	s.mu.Unlock()
	if len(ask) == 0 {
		return groups
	}
	due, err := s.st.DueBehaviors(ctx, ask, s.cfg.LookAhead)
	if err != nil {
		return groups // the claims report the database's trouble
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.DeleteFunc(groups, func(g claimGroup) bool {
		b := g.behaviors[0].Behavior
		if g.flow == nil || !slices.Contains(ask, b) || slices.Contains(due, b) {
			return false
		}
		s.markEmpty(g, now) // as a claim that found nothing: see activeGroups
		return true
	})
}

// activeGroups leaves out of groups those whose last claim found nothing
// less than a poll interval ago, unless woken, which forgets what the
// groups found: a claim that follows a busy group's need not ask the idle
// ones again. Each such claim is a round trip (three for a behavior under
// flow control, or a query to find nothing due), taken before the busy
// group's claim every cycle, and a busy node started its tasks a tenth
// slower for them. A task that falls due in an idle group is claimed when
// a notification or kick says so, as on an idle node, or by the next poll
// interval otherwise.
func (s *Server) activeGroups(groups []claimGroup, woken bool) []claimGroup {
	s.mu.Lock()
	defer s.mu.Unlock()
	if woken {
		clear(s.emptyAt)
		return groups
	}
	return slices.DeleteFunc(groups, func(g claimGroup) bool {
		at, ok := s.emptyAt[g.key()]
		return ok && time.Since(at) < s.cfg.PollInterval
	})
}

// markEmpty records that a claim of g found nothing at now. Server.mu
// must be held.
func (s *Server) markEmpty(g claimGroup, now time.Time) {
	if s.emptyAt == nil {
		s.emptyAt = map[string]time.Time{}
	}
	s.emptyAt[g.key()] = now
}

// forgetEmpty forgets that the claims of the groups behavior b may be
// claimed in found nothing: its own, and the main group with it (see
// claimGroup.key). What the main group without b found still stands: a
// busy node whose capped behaviors free slots all the time asked the
// empty main group again after each of them, a third of its claims.
// Server.mu must be held.
func (s *Server) forgetEmpty(b api.BehaviorID) {
	if s.freedAt == nil {
		s.freedAt = map[api.BehaviorID]time.Time{}
	}
	s.freedAt[b] = time.Now()
	delete(s.emptyAt, string(b))
	for k := range s.emptyAt {
		if strings.Contains(k+"\x00", "\x00"+string(b)+"\x00") {
			delete(s.emptyAt, k)
		}
	}
}

// freedSince reports whether a slot of a behavior of g freed (see
// forgetEmpty) since g's claim went out: that claim may have counted the
// slot taken, so finding nothing says nothing of the next claim.
// Server.mu must be held.
func (s *Server) freedSince(g claimGroup) bool {
	for _, b := range g.behaviors {
		if s.freedAt[b.Behavior].After(g.sent) {
			return true
		}
	}
	return false
}

// key names the claim group among those of one claim: "" for the main
// group, else the behavior it claims. A behavior capped on this node
// joins the main group when its cap leaves it as many slots as the node
// has free (while another claimer's claim holds most of them, say); the
// main group with it is named apart, each such behavior after a NUL, since
// what a claim of the main group without it found says nothing of its
// tasks. Left out as empty under "", it would wait for the poll.
func (g claimGroup) key() string {
	if g.main {
		if len(g.capped) == 0 {
			return ""
		}
		var b strings.Builder
		for _, c := range g.capped {
			b.WriteByte(0)
			b.WriteString(string(c))
		}
		return b.String()
	}
	return string(g.behaviors[0].Behavior)
}

// isFlowBusy reports whether the last claim of behavior b, claimed under
// flow control, found tasks; see store.ClaimRequest.Busy.
func (s *Server) isFlowBusy(b api.BehaviorID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flowBusy[b]
}

// returned lists the runs of behavior b that returned and whose end is not
// recorded yet; see store.ClaimRequest.Returned. Those that kept their
// slots for the hand-over of their finish (see handsOver) are left out:
// their slots are not this claim's to fill.
func (s *Server) returned(b api.BehaviorID) []store.LeaseRef {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.LeaseRef
	for _, r := range s.running {
		if r.returned && !r.handed && r.claimed.Behavior == b {
			out = append(out, r.claimed.LeaseRef)
		}
	}
	return out
}

// claimGroup is the behaviors one claim statement covers, with the slots
// reserved for it.
type claimGroup struct {
	behaviors []store.BehaviorLease
	limit     int
	flow      *spi.Policy      // the policy of a behavior claimed under flow control
	capped    []api.BehaviorID // behaviors with a per-node cap, reserved against it too
	main      bool             // the claim of every behavior without a tighter cap of its own
	sent      time.Time        // when its slots were reserved, just before its claim went out
	maxParams int              // the largest params its behaviors accept (spi.Policy.MaxParamsBytes)
}

// claimGroups splits the behaviors with free capacity into claims: one
// statement for all behaviors whose own cap exceeds the free slots, one
// per behavior whose cap is tighter, and one claim under flow control per
// behavior with caps across nodes, fair share or rate limits (see
// flowControlled).
// runtime holds the behaviors with caps set at runtime.
func (s *Server) claimGroups(runtime map[api.BehaviorID]bool) []claimGroup {
	s.mu.Lock()
	defer s.mu.Unlock()
	free := s.slots.free()
	if free <= 0 {
		return nil
	}
	var groups []claimGroup
	main := claimGroup{limit: free, main: true}
	for _, b := range s.behaviors {
		bl := store.BehaviorLease{Behavior: b.ID, Lease: b.Policy.Lease}
		maxParams := cmp.Or(b.Policy.MaxParamsBytes, spi.DefaultMaxParamsBytes)
		left, capped := s.slots.left(b.ID, b.Policy, free)
		switch {
		case left <= 0:
			if s.atCap == nil {
				s.atCap = map[api.BehaviorID]bool{}
			}
			s.atCap[b.ID] = true
		case flowControlled(b) || runtime[b.ID]:
			p := b.Policy
			groups = append(groups, claimGroup{behaviors: []store.BehaviorLease{bl}, limit: min(left, free),
				flow: &p, capped: []api.BehaviorID{b.ID}, maxParams: maxParams})
		case left < free:
			groups = append(groups, claimGroup{behaviors: []store.BehaviorLease{bl}, limit: min(left, free),
				capped: []api.BehaviorID{b.ID}, maxParams: maxParams})
		default:
			main.behaviors = append(main.behaviors, bl)
			main.maxParams = max(main.maxParams, maxParams)
			if capped {
				main.capped = append(main.capped, b.ID)
			}
		}
	}
	if len(main.behaviors) > 0 {
		groups = append([]claimGroup{main}, groups...)
	}
	return groups
}

// reserve reserves the slots a claim of g may fill: no more than are free
// now, nor than its capped behaviors have left.
// A claim under flow control is not sent while another of its behavior is
// in flight from this node: it would wait for the first one's turn, and
// its slots with it (a claim of one task waited behind every claim of a
// thousand, and delayed the next).
// When it reserves nothing while claims are in flight, whose slots may be
// what it lacked, held is closed once one of them returns; so too when
// another claim of its behavior is in flight, which may have started
// before the slot this claim was woken for freed.
func (s *Server) reserve(g claimGroup) (_ claimGroup, ok bool, held <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.flow != nil && s.flowClaiming[g.behaviors[0].Behavior] {
		return g, false, s.claimReturned
	}
	g.limit = s.slots.reserve(s.claimRoom(g), g.capped, s.policy)
	if g.limit <= 0 {
		if s.claiming > 0 {
			held = s.claimReturned
		}
		return g, false, held
	}
	s.claiming++
	if g.flow != nil {
		if s.flowClaiming == nil {
			s.flowClaiming = map[api.BehaviorID]bool{}
		}
		s.flowClaiming[g.behaviors[0].Behavior] = true
	}
	g.sent = time.Now()
	return g, true, nil
}

// claimRoom returns how many slots a claim of g may reserve: all of
// g.limit, unless the node's own submits started tasks here lately
// (within a poll interval), or a workflow node's run returned (its finish
// may start the nodes it makes ready: see offerNodeStarts), and g's last
// claim found no backlog. Then it reserves half of them, rounded up, and
// leaves the rest to those local starts (see reserveStarts): a claim
// that finds few tasks would otherwise hold
// every free slot while it is in the database, and a submit at that
// moment would wait for it or leave its task to the next claim. A claim
// that fills its half finds a backlog, and the next one asks for every
// free slot. Claims under flow control never share their behaviors with
// local starts. Server.mu is held.
//
// A claim also reads no more than about maxClaimBytes of params and
// progress, by the size of the tasks its group's last claim read, and
// before any did, by the largest params its behaviors accept
// (spi.Policy.MaxParamsBytes): one statement that reads a hundred tasks
// of a megabyte each may outrun its deadline after it committed (its
// tasks are then given back: see releaseClaim). A claim that failed
// makes the next one of its group ask for half as many tasks, down to
// one, until one succeeds.
func (s *Server) claimRoom(g claimGroup) int {
	room := g.limit
	if g.flow == nil && !s.backlog[g.key()] && !s.localAt.IsZero() && time.Since(s.localAt) < s.cfg.PollInterval {
		room = (g.limit + 1) / 2
	}
	b, ok := s.taskBytes[g.key()]
	if !ok {
		b = g.maxParams
	}
	return min(room, max(1, maxClaimBytes/max(b, 1)))
}

// maxClaimBytes bounds the params and progress one claim reads (see
// claimRoom): 16 MiB, a few hundred milliseconds of a claim's deadline of
// at least 5 s on a slow link.
const maxClaimBytes = 16 << 20

// noteTaskBytes records the bytes per task of the tasks a claim of g read,
// or, for a claim that failed (ok unset), as many as would let the next
// claim ask for half its tasks; see claimRoom. Server.mu is held.
func (s *Server) noteTaskBytes(g claimGroup, claimed []store.Claimed, ok bool) {
	if ok && len(claimed) == 0 {
		return
	}
	if s.taskBytes == nil {
		s.taskBytes = map[string]int{}
	}
	if !ok {
		s.taskBytes[g.key()] = max(s.taskBytes[g.key()], maxClaimBytes/max(1, g.limit/2))
		return
	}
	total := 0
	for _, c := range claimed {
		total += len(c.Params) + len(c.Progress)
	}
	s.taskBytes[g.key()] = total / len(claimed)
}

// policy returns the policy of a registered behavior.
func (s *Server) policy(b api.BehaviorID) spi.Policy {
	reg, _ := s.cfg.Registry.Lookup(b)
	return reg.Policy
}

// unreserve gives back the slots a claim reserved and did not fill; ok
// tells whether the claim statement succeeded, drained whether it took
// all its caps across nodes admit (store.FlowHeld.Drained).
//
// The group of a drained claim counts as empty, as if the claim had found
// nothing, until a slot of its behavior frees (see forgetEmpty) or a
// wake-up: asking again at once found nothing, a transaction that took
// the behavior's turn and counted its runs each time its runs started.
func (s *Server) unreserve(g claimGroup, claimed []store.Claimed, ok, drained bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slots.unreserve(g.limit, g.capped, claimed)
	s.noteTaskBytes(g, claimed, ok)
	if ok {
		if s.backlog == nil {
			s.backlog = map[string]bool{}
		}
		s.backlog[g.key()] = len(claimed) >= g.limit
	}
	s.claiming--
	switch {
	case !ok:
	case len(claimed) == 0 && s.claiming > 0:
		// Another claim in flight may have locked the rows this one
		// skipped: the group is not known to be empty, and marking it so
		// would leave it out until a wake-up or a poll.
	case (len(claimed) == 0 || drained) && !s.freedSince(g):
		s.markEmpty(g, time.Now())
	default:
		delete(s.emptyAt, g.key())
	}
	if g.flow != nil {
		b := g.behaviors[0].Behavior
		delete(s.flowClaiming, b)
		if s.flowBusy == nil {
			s.flowBusy = map[api.BehaviorID]bool{}
		}
		s.flowBusy[b] = ok && len(claimed) > 0
	}
	close(s.claimReturned)
	s.claimReturned = make(chan struct{})
}
