package impl

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// Flow control: rate limits and concurrency caps, stored in the database
// and enforced by the claims of every node (store.Store.ClaimFlow).
//
// A task names the rate limits it uses at submit (spi.RateLimiter). A limit
// the database does not hold is created from the submitting behavior's
// declared default (spi.Policy.RateLimits) by the first submit that names
// it; a limit neither stored nor declared is refused, as are units over
// the limit's Limit: the submit stores nothing.

var _ api.Limits = (*Client)(nil)

// SetRateLimit stores a rate limit; see api.Limits.
func (c *Client) SetRateLimit(ctx context.Context, l api.RateLimit) error {
	if err := spi.CheckRateLimit(l); err != nil {
		return fmt.Errorf("set rate limit %q: %w", l.Name, err)
	}
	if err := c.st.SetRateLimit(ctx, l); err != nil {
		return err
	}
	c.rates.forget(l.Name)
	return nil
}

// RemoveRateLimit deletes a rate limit; see api.Limits.
func (c *Client) RemoveRateLimit(ctx context.Context, name string) error {
	if err := spi.CheckRateLimitName("name", name); err != nil {
		return fmt.Errorf("remove rate limit: %w", err)
	}
	c.rates.forget(name)
	return c.st.RemoveRateLimit(ctx, name)
}

// RateLimits lists the rate limits; see api.Limits.
func (c *Client) RateLimits(ctx context.Context) ([]api.RateLimitInfo, error) {
	return c.st.RateLimits(ctx)
}

// SetConcurrencyLimit stores a cap; see api.Limits. A behavior neither
// registered with the client nor run by a live node is refused unless
// l.Force is set.
func (c *Client) SetConcurrencyLimit(ctx context.Context, l api.ConcurrencyLimit) error {
	if err := spi.CheckConcurrencyLimit(l); err != nil {
		return fmt.Errorf("set concurrency limit of %s: %w", capName(l.Behavior, l.Key), err)
	}
	if !l.Force {
		if err := c.checkKnownBehavior(ctx, l.Behavior); err != nil {
			return fmt.Errorf("set concurrency limit of %s: %w", capName(l.Behavior, l.Key), err)
		}
	}
	if err := c.st.SetConcurrencyLimit(ctx, l); err != nil {
		return err
	}
	if c.capsChanged != nil {
		c.capsChanged()
	}
	return nil
}

// RemoveConcurrencyLimit deletes a cap; see api.Limits.
func (c *Client) RemoveConcurrencyLimit(ctx context.Context, behavior api.BehaviorID, key string) error {
	if err := spi.CheckBehaviorID(behavior); err != nil {
		return fmt.Errorf("remove concurrency limit: %w", err)
	}
	if key != "" {
		if err := spi.CheckGroupKey("key", key); err != nil {
			return fmt.Errorf("remove concurrency limit of %s: %w", behavior, err)
		}
	}
	if err := c.st.RemoveConcurrencyLimit(ctx, behavior, key); err != nil {
		return err
	}
	if c.capsChanged != nil {
		c.capsChanged()
	}
	return nil
}

// ConcurrencyLimits lists the caps set at runtime; see api.Limits.
func (c *Client) ConcurrencyLimits(ctx context.Context) ([]api.ConcurrencyInfo, error) {
	return c.st.ConcurrencyLimits(ctx)
}

// capName names the cap of behavior and key in messages: the behavior
// alone for its cap as a whole, else `b key "k"`.
func capName(behavior api.BehaviorID, key string) string {
	if key == "" {
		return string(behavior)
	}
	return fmt.Sprintf("%s key %q", behavior, key)
}

// rateCache remembers the rate limits submits found stored, for a second,
// so that a stream of submits naming a limit checks it once a second, not
// once per submit. A limit changed meanwhile is checked against its old
// values at most that long; claims always enforce the stored ones.
type rateCache struct {
	mu  sync.Mutex
	m   map[string]cachedLimit
	now func() time.Time // time.Now unless a test sets it
}

type cachedLimit struct {
	limit api.RateLimit
	at    time.Time
}

// rateCacheTTL is how long a looked-up limit is trusted by submits.
const rateCacheTTL = time.Second

func (rc *rateCache) get(name string) (api.RateLimit, bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	e, ok := rc.m[name]
	if !ok || rc.clock().Sub(e.at) > rateCacheTTL {
		return api.RateLimit{}, false
	}
	return e.limit, true
}

func (rc *rateCache) put(l api.RateLimit) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.m == nil {
		rc.m = map[string]cachedLimit{}
	}
	rc.m[l.Name] = cachedLimit{limit: l, at: rc.clock()}
}

func (rc *rateCache) clock() time.Time {
	if rc.now != nil {
		return rc.now()
	}
	return time.Now()
}

func (rc *rateCache) forget(name string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	delete(rc.m, name)
}

// checkRateUses checks the rate uses of tasks (of the registrations regs,
// in order) against the stored limits, storing the declared defaults of
// limits first named: a limit neither stored nor declared by the task's
// behavior, or units over a limit's Limit, is an *api.InvalidError naming
// the task. A declared default is stored only once every task passes the
// check against it, so that a refused submit stores nothing.
func (c *Client) checkRateUses(ctx context.Context, tasks []store.NewTask, regs []*spi.Registration) error {
	// The limits are looked up once, into known: a cached limit may expire
	// between two lookups, and a limit found must not be missing at the
	// check.
	known := map[string]api.RateLimit{}
	var missing []string
	defaults := map[string]api.RateLimit{}
	for i, t := range tasks {
		for _, u := range t.RateUses {
			if _, ok := known[u.Limit]; ok || slices.Contains(missing, u.Limit) {
				continue
			}
			if l, ok := c.rates.get(u.Limit); ok {
				known[u.Limit] = l
				continue
			}
			missing = append(missing, u.Limit)
			for _, d := range regs[i].Policy.RateLimits {
				if d.Name == u.Limit {
					defaults[d.Name] = d
					break
				}
			}
		}
	}
	if len(missing) == 0 {
		return checkUses(tasks, regs, known)
	}
	if err := c.lookUpLimits(ctx, nil, missing, known); err != nil {
		return err
	}
	var declared []api.RateLimit
	var names []string
	for _, name := range missing {
		if d, ok := defaults[name]; ok {
			if _, stored := known[name]; !stored {
				declared, names = append(declared, d), append(names, name)
			}
		}
	}
	if len(declared) > 0 {
		would := maps.Clone(known)
		for _, d := range declared {
			would[d.Name] = d
		}
		if err := checkUses(tasks, regs, would); err != nil {
			return err
		}
		if err := c.lookUpLimits(ctx, declared, names, known); err != nil {
			return err
		}
	}
	return checkUses(tasks, regs, known)
}

// lookUpLimits adds the stored limits of names to known and to the cache,
// storing first the limits of declared that are not stored yet.
func (c *Client) lookUpLimits(ctx context.Context, declared []api.RateLimit, names []string, known map[string]api.RateLimit) error {
	found, err := c.st.EnsureRateLimits(ctx, declared, names)
	if err != nil {
		return err
	}
	for _, l := range found {
		c.rates.put(l)
		known[l.Name] = l
	}
	return nil
}

// checkUses checks the rate uses of tasks (of the registrations regs, in
// order) against the limits known.
func checkUses(tasks []store.NewTask, regs []*spi.Registration, known map[string]api.RateLimit) error {
	for i, t := range tasks {
		for j, u := range t.RateUses {
			l, ok := known[u.Limit]
			field := fmt.Sprintf("rate_uses[%d]", j)
			if !ok {
				return fmt.Errorf("task %s: %w", t.ID, api.Invalid(field+".limit",
					"rate limit %q does not exist and %s declares no default for it", u.Limit, regs[i].ID))
			}
			if u.Units > l.Limit {
				return fmt.Errorf("task %s: %w", t.ID, api.Invalid(field+".units",
					"%d is over the limit %q of %d per %s", u.Units, u.Limit, l.Limit, l.Period))
			}
		}
	}
	return nil
}

// rateUsesOf returns the checked rate uses of a task of reg with decoded
// params p, as stored.
func rateUsesOf(reg *spi.Registration, p any) ([]store.RateUse, error) {
	uses, err := reg.RateUses(p)
	if err != nil || len(uses) == 0 {
		return nil, err
	}
	out := make([]store.RateUse, len(uses))
	for i, u := range uses {
		out[i] = store.RateUse{Limit: u.Limit, Key: u.Key, Units: u.Units}
	}
	return out, nil
}

// flowWait fills t.Waiting for a task waiting to run whose behavior has a
// cap that is full (a rate limit's wait is stored with the task).
func (c *Client) flowWait(ctx context.Context, t *api.Task) {
	if t.Waiting != nil || t.Status == api.StatusRunning || t.Status == api.StatusHeld || t.Finished() {
		return
	}
	if t.ScheduleNotBefore == nil || t.ScheduleNotBefore.After(time.Now()) {
		return
	}
	cluster, perGroup := 0, 0
	if reg, ok := c.reg.Lookup(t.Behavior); ok {
		cluster, perGroup = reg.Policy.ClusterConcurrency, reg.Policy.GroupConcurrency
	}
	w, err := c.st.ConcurrencyWait(ctx, t.Behavior, t.GroupKey, cluster, perGroup)
	if err == nil {
		t.Waiting = w
	}
}

// flowWaits is flowWait for a page of tasks: each behavior and key is
// looked up once, and only behaviors with a cap (in their policy or set
// at runtime) are.
func (c *Client) flowWaits(ctx context.Context, tasks []api.Task) {
	var capped []api.BehaviorID
	looked := false
	type ref struct {
		b api.BehaviorID
		k string
	}
	waits := map[ref]*api.Wait{}
	for i := range tasks {
		t := &tasks[i]
		if t.Waiting != nil || t.Status == api.StatusRunning || t.Status == api.StatusHeld || t.Finished() ||
			t.ScheduleNotBefore == nil || t.ScheduleNotBefore.After(time.Now()) {
			continue
		}
		reg, ok := c.reg.Lookup(t.Behavior)
		if !ok || (reg.Policy.ClusterConcurrency == 0 && reg.Policy.GroupConcurrency == 0) {
			if !looked {
				looked = true
				var err error
				if capped, err = c.st.CappedBehaviors(ctx); err != nil {
					return
				}
			}
			if !slices.Contains(capped, t.Behavior) {
				continue
			}
		}
		r := ref{t.Behavior, t.GroupKey}
		w, ok := waits[r]
		if !ok {
			c.flowWait(ctx, t)
			waits[r] = t.Waiting
			continue
		}
		t.Waiting = w
	}
}

// flowControlled reports whether the claims of reg's tasks take the flow
// controlled path by policy: it caps its tasks across nodes (per group key
// or in all), serves its keys in turn, or its tasks may use rate limits.
// A behavior capped at runtime takes it too (Server.runtimeCaps).
func flowControlled(reg *spi.Registration) bool {
	p := reg.Policy
	return p.GroupConcurrency > 0 || p.ClusterConcurrency > 0 || p.FairShare || reg.RateLimited()
}

// capsRefresh is how often a server reads which behaviors have caps set at
// runtime, besides right after one is set through it. Until then a plain
// claim leaves a newly capped behavior out (the statement checks), so the
// refresh bounds how late its tasks start, not whether the cap holds.
const capsRefresh = time.Second

// runtimeCaps returns the behaviors with caps set at runtime, as last read
// (at most capsRefresh ago). A failed read keeps the last answer; the
// claim that follows reports the database's trouble.
func (s *Server) runtimeCaps(ctx context.Context) map[api.BehaviorID]bool {
	s.capsMu.Lock()
	defer s.capsMu.Unlock()
	if s.capsRead.IsZero() || time.Since(s.capsRead) >= capsRefresh {
		ids, err := s.st.CappedBehaviors(ctx)
		if err == nil {
			s.caps = map[api.BehaviorID]bool{}
			for _, id := range ids {
				s.caps[id] = true
			}
			s.capsRead = time.Now()
		}
	}
	return s.caps
}

// capsSet makes the next claim read the caps set at runtime again, and
// wakes the claimers.
func (s *Server) capsSet() {
	s.capsMu.Lock()
	s.capsRead = time.Time{}
	s.capsMu.Unlock()
	s.wakeClaimer()
}

// capsFreed returns the behaviors, each once, of the runs of batch that
// ended under a cap across nodes that a claim found full lately (within
// cappedFor), here or on another node: the slots they free may start
// tasks the cap held back, on any node. A cap that never binds, the common
// case, wakes nobody: every end of a batch woke this node's claimers (and
// so every idle claim group; see activeGroups) and sent a notification, a
// tenth of the throughput of no-op tasks under a cap set high. Nor does a
// run whose slot the hand-over of its finish filled again (see
// handsOver): it freed nothing. unheard
// are those of freed that have a run whose return did not wake this
// node's claimers already (see freeSlot).
func (s *Server) capsFreed(batch []*run) (freed, unheard []api.BehaviorID) {
	s.capsMu.Lock()
	defer s.capsMu.Unlock()
	for _, r := range batch {
		b := r.claimed.Behavior
		if r.refilled || !s.cappedLately(b) {
			continue
		}
		if !slices.Contains(freed, b) {
			freed = append(freed, b)
		}
		if !r.freedCap && !slices.Contains(unheard, b) {
			unheard = append(unheard, b)
		}
	}
	return freed, unheard
}

// cappedLately reports whether a claim found a cap across nodes of
// behavior b full lately (within cappedFor), here or on another node.
// Server.capsMu must be held.
func (s *Server) cappedLately(b api.BehaviorID) bool {
	at, ok := s.cappedAt[b]
	return ok && time.Since(at) < cappedFor
}

// Bounds of the notes of full caps (see capsFreed): a claim held back by a
// cap tells the other nodes at most once per capNotice, and a note lasts
// cappedFor, well beyond it, so that the nodes keep waking the claimers for
// as long as claims keep finding the cap full.
const (
	capNotice = time.Second
	cappedFor = 10 * time.Second
)

// noteCapped notes that a claim of behavior b found a cap across nodes
// full. tell sends the note to the other nodes (store.ChannelCapped), at
// most once per capNotice.
func (s *Server) noteCapped(b api.BehaviorID, tell bool) {
	s.capsMu.Lock()
	now := time.Now()
	if s.cappedAt == nil {
		s.cappedAt, s.noticed = map[api.BehaviorID]time.Time{}, map[api.BehaviorID]time.Time{}
	}
	s.cappedAt[b] = now
	tell = tell && now.Sub(s.noticed[b]) >= capNotice
	if tell {
		s.noticed[b] = now
	}
	s.capsMu.Unlock()
	if !tell {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	if err := s.st.Notify(ctx, store.ChannelCapped, string(b)); err != nil {
		s.log.Warn("stint: telling the other nodes of a full cap failed; their ends of runs wake this node's claimers only at its poll", "behavior", b, "err", err)
	}
}
