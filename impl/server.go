package impl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Node names this node in the nodes table and on the tasks it runs.
	// Defaults to host-pid-random.
	Node string
	// Registry holds the behaviors the server knows. Required.
	Registry *spi.Registry
	// Behaviors are the behaviors this node runs. Defaults to all in
	// Registry; a server submits any registered behavior either way.
	Behaviors []api.BehaviorID
	// MaxWorkers caps the tasks this node runs at once. Defaults to 1,000:
	// runs are goroutines, and waiting ones cost little.
	MaxWorkers int
	// PollInterval is how often the claimer looks for due tasks when no
	// notification woke it: the bound on the lateness of tasks due more
	// than a minute after their submit or last run (sooner ones are
	// kicked when due by the process that stored them) and of lost-task
	// takeover past the lease. Defaults to 1 second. After a failed
	// claim the claimer backs off no further than this, so that a task
	// submitted while the database was unavailable starts within it once
	// the database serves again.
	PollInterval time.Duration
	// ClaimConcurrency is how many claim statements may be in flight at
	// once. Defaults to 2: while one claim is in the database, the other
	// fills the slots freed meanwhile.
	ClaimConcurrency int
	// FetchCooldown is the pause between claims while tasks keep coming,
	// so that claims are batches rather than one statement per task.
	// Defaults to 1 millisecond.
	FetchCooldown time.Duration
	// LookAhead also claims tasks due within this window, to run them
	// early (couch_jobs' max_sched_time). Defaults to zero: only due tasks.
	LookAhead time.Duration
	// NodeHeartbeat is how often the node renews its row in the nodes
	// table. Defaults to 5 seconds. Nodes silent for 10 heartbeats are
	// dropped from the table by any other node.
	NodeHeartbeat time.Duration
	// Maintenance tunes the upkeep every server does: dropping dead feed
	// consumers and nodes, trimming the change feed.
	Maintenance Maintenance
	// NoLocalStart turns off local starts. By default (false) a task
	// this server submits (Submit and SubmitMany, not in a caller's
	// transaction) starts at once on this node, without a claim, when the
	// submit creates it, it is due now (no delay, no initial delay), this
	// node runs its behavior, that behavior caps no group key
	// (Policy.GroupConcurrency) and merges no submits (a Combiner), and
	// the node has a free slot for it (MaxWorkers and the behavior's own
	// caps, as for a claim; a claim statement in flight holds every free
	// slot until it returns, and when the last claim found no backlog the
	// submit waits for it, up to 20 milliseconds); and, checked in the
	// submit statement, the behavior is not paused, its group key is not
	// held, and no due task of its behavior with the same or a higher
	// priority waits for a claim, so that a local start never jumps the
	// claimers' backlog. The submit then stores it running under a lease
	// for this node, as a claim would, and its run starts as a claimed one
	// does. Every other task waits for a claim.
	NoLocalStart bool
	// AwaitPollInterval is ClientConfig.PollInterval for the server's own
	// Awaits.
	AwaitPollInterval time.Duration
	// Logger receives the server's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider and MeterProvider receive spans (one per submit and
	// per run) and metrics. Default to OpenTelemetry's global providers.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Maintenance tunes a server's upkeep. Zero fields take the defaults.
type Maintenance struct {
	// Interval is the time between rounds. Defaults to 30 seconds.
	Interval time.Duration
	// ConsumerTimeout drops feed consumers that did not ack for this long.
	// Defaults to 10 minutes.
	ConsumerTimeout time.Duration
	// FeedMinRetention keeps every change this long. Defaults to 1 hour.
	FeedMinRetention time.Duration
	// FeedMaxRetention drops changes this old even if a live consumer did
	// not read them. Defaults to 7 days.
	FeedMaxRetention time.Duration
	// NodeTimeout drops nodes whose heartbeat is this old: they died
	// without deregistering. Defaults to ten node heartbeats.
	NodeTimeout time.Duration
	// Batch caps the changes one statement trims from the feed; a round
	// trims batches until one comes back short. Defaults to 10,000.
	Batch int
	// HistoryInterval is how often the node adds the runs that ended on
	// it to the dashboard's history in the database, and offers to sample
	// the backlog and queue lag (one node per minute does). Defaults to
	// 10 seconds.
	HistoryInterval time.Duration
}

func (m Maintenance) withDefaults() Maintenance {
	if m.Interval <= 0 {
		m.Interval = 30 * time.Second
	}
	if m.ConsumerTimeout <= 0 {
		m.ConsumerTimeout = 10 * time.Minute
	}
	if m.FeedMinRetention <= 0 {
		m.FeedMinRetention = time.Hour
	}
	if m.FeedMaxRetention <= 0 {
		m.FeedMaxRetention = 7 * 24 * time.Hour
	}
	if m.Batch <= 0 {
		m.Batch = 10_000
	}
	if m.HistoryInterval <= 0 {
		m.HistoryInterval = 10 * time.Second
	}
	return m
}

// Server runs tasks and, like a Client, submits and awaits them. Create it
// with NewServer, then Start it; Stop it to finish or release its runs.
type Server struct {
	*Client
	cfg       ServerConfig
	behaviors []*spi.Registration
	minLease  time.Duration
	// schedules are those the behaviors declare, stored at Start.
	schedules []api.Schedule

	wakes       []chan struct{} // one wake-up channel per claimer
	slotFreed   chan struct{}
	dispatch    dispatch      // runs waiting for a worker goroutine
	workersDone chan struct{} // closed by Stop: idle workers exit

	mu sync.Mutex
	// running holds the runs until their end is recorded, in no order
	// (run.at is a run's index): a slice, since it is only walked, and a
	// map keyed by lease ref cost a string hash per run start and end.
	running  []*run
	latest   map[api.TaskID]*run // the newest run of each task in running
	slots    slots
	leases   map[[16]byte]leaseRuns // this node's leases (one per claim statement and behavior)
	released [][16]byte             // leases whose runs all ended, to drop
	halt     error                  // set by Stop when it gives up waiting: the cause that cancels every run
	started  bool
	stopped  bool
	// claiming counts the claim statements in flight; claimReturned is
	// closed (and replaced) when one returns. idle is set when the last
	// claim of the main group found fewer tasks than it asked for (no
	// backlog). A local start may wait for a claim, up to startWait
	// (localStartWait); startWaiting counts the submits waiting. See
	// reserveStarts.
	claiming      int
	claimReturned chan struct{}
	idle          bool
	startWait     time.Duration
	startWaiting  int

	beatNow     chan struct{}      // asks the lease keeper for a heartbeat now
	claimCancel context.CancelFunc // stops claiming
	bgCancel    context.CancelFunc // stops the lease keeper and completer
	claimDone   chan struct{}
	bgDone      sync.WaitGroup
	runs        sync.WaitGroup
	localStarts sync.WaitGroup // submits that may start tasks on this node, in flight
	completer   *completer

	// capsMu guards caps, the behaviors with caps set at runtime as read
	// at capsRead (see runtimeCaps).
	capsMu   sync.Mutex
	caps     map[api.BehaviorID]bool
	capsRead time.Time
}

var _ api.Tasks = (*Server)(nil)

// errStopping cancels runs that outlive Stop's deadline; they are released,
// not failed.
var errStopping = errors.New("stint: server stopping")

// NewServer returns a server on st. It checks the configuration but touches
// nothing until Start.
func NewServer(st store.Store, cfg ServerConfig) (*Server, error) {
	if cfg.Registry == nil {
		return nil, errors.New("new server: ServerConfig.Registry is required")
	}
	client, err := NewClient(st, ClientConfig{Registry: cfg.Registry, PollInterval: cfg.AwaitPollInterval, Logger: cfg.Logger,
		TracerProvider: cfg.TracerProvider, MeterProvider: cfg.MeterProvider})
	if err != nil {
		return nil, fmt.Errorf("new server: %w", err)
	}
	if cfg.Node == "" {
		host, _ := os.Hostname()
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		cfg.Node = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	if cfg.MaxWorkers <= 0 {
		cfg.MaxWorkers = 1000
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.ClaimConcurrency <= 0 {
		cfg.ClaimConcurrency = 2
	}
	if cfg.FetchCooldown <= 0 {
		cfg.FetchCooldown = time.Millisecond
	}
	if cfg.NodeHeartbeat <= 0 {
		cfg.NodeHeartbeat = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Maintenance = cfg.Maintenance.withDefaults()
	if cfg.Maintenance.NodeTimeout <= 0 {
		cfg.Maintenance.NodeTimeout = 10 * cfg.NodeHeartbeat
	}
	ids := cfg.Behaviors
	if len(ids) == 0 {
		ids = cfg.Registry.IDs()
	}
	s := &Server{
		Client:        client,
		cfg:           cfg,
		slotFreed:     make(chan struct{}, 1),
		claimReturned: make(chan struct{}),
		startWait:     localStartWait,
		workersDone:   make(chan struct{}),
		latest:        map[api.TaskID]*run{},
		slots:         newSlots(cfg.MaxWorkers),
		leases:        map[[16]byte]leaseRuns{},
		beatNow:       make(chan struct{}, 1),
	}
	client.local = s
	client.inc.change = func() { signal(s.beatNow) }
	client.capsChanged = s.capsSet
	for _, id := range ids {
		reg, ok := cfg.Registry.Lookup(id)
		if !ok {
			return nil, fmt.Errorf("new server: behavior %q is not registered", id)
		}
		s.behaviors = append(s.behaviors, reg)
		if s.minLease == 0 || reg.Policy.Lease < s.minLease {
			s.minLease = reg.Policy.Lease
		}
	}
	if len(s.behaviors) == 0 {
		return nil, errors.New("new server: no behaviors to run")
	}
	for range cfg.ClaimConcurrency {
		s.wakes = append(s.wakes, make(chan struct{}, 1))
	}
	if s.schedules, err = s.registeredSchedules(); err != nil {
		return nil, fmt.Errorf("new server: %w", err)
	}
	observeServer(cfg.MeterProvider, cfg.Node, ids, s.Running, st.MetricStats)
	observeLimits(cfg.MeterProvider, s.Client)
	return s, nil
}

// Node returns the node id.
func (s *Server) Node() string { return s.cfg.Node }

// Start registers the node and starts claiming. Runs outlive ctx; use Stop
// to end them. While the database cannot take the node's registration for
// a reason of its own (api.ErrUnavailable: a server in recovery, one that
// refuses writes or does not answer), Start logs the incident and tries
// again with a backoff, until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("start server: already started")
	}
	s.started = true
	s.mu.Unlock()

	err := s.registerAll(ctx)
	if err != nil {
		// Nothing started: Stop has nothing to stop, and Start may be
		// tried again.
		s.mu.Lock()
		s.started = false
		s.mu.Unlock()
		return fmt.Errorf("start server: %w", err)
	}
	s.hub.setOnDue(s.wakeClaimer)
	s.hub.setOnRemoved(s.cancelRemoved)
	s.kick.setLocal(s.wakeClaimer)
	s.hub.start()

	bgCtx, bgCancel := context.WithCancel(context.Background())
	claimCtx, claimCancel := context.WithCancel(context.Background())
	s.bgCancel, s.claimCancel = bgCancel, claimCancel
	s.completer = newCompleter(s.st, s.log, s.inc, s.recorded)
	s.claimDone = make(chan struct{})

	s.bgDone.Add(5)
	go func() { defer s.bgDone.Done(); s.completer.loop(bgCtx) }()
	go func() { defer s.bgDone.Done(); s.expiryLoop(bgCtx) }()
	go func() { defer s.bgDone.Done(); s.leaseLoop(bgCtx) }()
	go func() { defer s.bgDone.Done(); s.takeoverLoop(bgCtx) }()
	go func() { defer s.bgDone.Done(); s.maintainLoop(bgCtx) }()
	s.bgDone.Add(2)
	go func() { defer s.bgDone.Done(); s.scheduleLoop(bgCtx) }()
	go func() { defer s.bgDone.Done(); s.historyLoop(bgCtx) }()
	for _, b := range s.behaviors {
		if b.Policy.Rotation != nil {
			s.bgDone.Add(1)
			go func() { defer s.bgDone.Done(); s.rotateLoop(bgCtx, b) }()
		}
	}
	go func() {
		defer close(s.claimDone)
		var claimers sync.WaitGroup
		for _, wake := range s.wakes {
			claimers.Go(func() { s.claimLoop(claimCtx, wake) })
		}
		claimers.Wait()
	}()
	for _, b := range s.behaviors {
		if err := b.Start(ctx, s); err != nil {
			_ = s.Stop(context.Background())
			return fmt.Errorf("start server: behavior %s: %w", b.ID, err)
		}
	}
	s.log.Info("stint: server started", "node", s.cfg.Node, "behaviors", s.behaviorIDs(), "max_workers", s.cfg.MaxWorkers)
	return nil
}

// registerAll records the node and its behaviors' schedules, waiting while
// the database is unavailable.
func (s *Server) registerAll(ctx context.Context) error {
	for failures := 1; ; failures++ {
		err := s.register(ctx)
		if err == nil {
			err = s.st.PutSchedules(ctx, s.schedules, true)
		}
		if err == nil {
			s.inc.ok(false)
			return nil
		}
		if ctx.Err() != nil || !s.inc.failed("start", err) {
			return err
		}
		if sleep(ctx, spi.Backoff(100*time.Millisecond, 5*time.Second, failures)); ctx.Err() != nil {
			return unavailable(err)
		}
	}
}

// register records the node in the nodes table.
func (s *Server) register(ctx context.Context) error {
	host, _ := os.Hostname()
	return s.st.RegisterNode(ctx, store.Node{ID: s.cfg.Node, Host: host, PID: os.Getpid(),
		Behaviors: s.behaviorIDs(), MaxWorkers: s.cfg.MaxWorkers})
}

func (s *Server) behaviorIDs() []api.BehaviorID {
	ids := make([]api.BehaviorID, len(s.behaviors))
	for i, b := range s.behaviors {
		ids[i] = b.ID
	}
	return ids
}

// Stop stops claiming and waits for running tasks to finish until ctx is
// done; the runs still going then are cancelled and released, due again at
// once on any node. Runs of preemptible behaviors (with a Rotation) are
// stopped and released at once, without waiting. Then the node
// deregisters. Stop is safe to call when Start failed or never ran (it
// only closes the client then) and more than once, so that
// `defer srv.Stop(ctx)` may follow NewServer.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	if !s.started || s.stopped {
		s.mu.Unlock()
		s.Client.Close()
		return nil
	}
	s.stopped = true
	s.mu.Unlock()

	s.claimCancel()
	<-s.claimDone
	s.localStarts.Wait()
	s.stopPreemptible()
	finished := make(chan struct{})
	go func() { s.runs.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-ctx.Done():
		s.cancelRuns(errStopping)
		<-finished
	}
	close(s.workersDone)
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	s.releaseLeases(rctx)
	rcancel()
	s.bgCancel()
	s.bgDone.Wait()
	s.recordLastHistory()
	s.Client.Close()
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.st.DeregisterNode(dctx, s.cfg.Node); err != nil {
		return fmt.Errorf("stop server: %w", err)
	}
	s.log.Info("stint: server stopped", "node", s.cfg.Node)
	return nil
}

// stopPreemptible stops the runs of preemptible behaviors (those with a
// Rotation) at once, as a rotation would: their tasks are handed back, due
// again without an attempt counted, and resume from their last checkpoint.
// Waiting for them would only spend the whole grace period, since such a
// run (a continuous replication) need not ever end by itself.
func (s *Server) stopPreemptible() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.running {
		if r.reg.Policy.Rotation != nil {
			r.cancel(errStopping)
		}
	}
}

// Running returns how many tasks this node runs now.
func (s *Server) Running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slots.running()
}

// wakeClaimer wakes every claimer. Waking one would do for a single due
// task, but a claimer that finds every free slot reserved by another's
// claim in flight waits for a slot, not for a wake-up, and that claim may
// have started before the task was due: the wake-up kept by the claimer
// in flight makes it claim again when its claim returns.
func (s *Server) wakeClaimer() {
	for _, w := range s.wakes {
		signal(w)
	}
}

// cancelRemoved cancels the local run of a removed task, if any; its
// writes are fenced out either way.
func (s *Server) cancelRemoved(id api.TaskID) {
	s.mu.Lock()
	r := s.latest[id] // older runs were cancelled when it started
	s.mu.Unlock()
	if r != nil {
		r.cancel(fmt.Errorf("task %s was removed: %w", id, api.ErrHalt))
	}
}

// claimLoop claims due tasks while there are free slots and claims find
// some, and waits for a wake-up, a freed slot or the poll interval
// otherwise. A claim follows one that found tasks even when that one found
// fewer than it asked for: under a stream of submits, whose notifications
// are coalesced to one per client and window, the next tasks are due
// before the next notification.
func (s *Server) claimLoop(ctx context.Context, wake <-chan struct{}) {
	poll := time.NewTimer(s.cfg.PollInterval)
	defer poll.Stop()
	failures := 0
	for ctx.Err() == nil {
		n, full, err := s.claimOnce(ctx)
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
		case <-poll.C:
		}
	}
}

// claimOnce claims tasks for the free slots. full is set when no slot is
// left. Slots are reserved before a claim statement goes out, so that the
// claimers running side by side never claim more than the free slots.
func (s *Server) claimOnce(ctx context.Context) (n int, full bool, err error) {
	for _, g := range s.claimGroups(s.runtimeCaps(ctx)) {
		g, ok := s.reserve(g)
		if !ok {
			continue
		}
		sent := time.Now()
		// The statement is not cancelled with the claimer: a cancel that
		// reaches the database after the claim committed would leave its
		// tasks claimed with no run, until their lease expired. Stop waits
		// for the claimers, so the runs of a claim that completes start
		// and are stopped as every other run.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(s.minLease, 5*time.Second))
		req := store.ClaimRequest{Node: s.cfg.Node, Behaviors: g.behaviors, Limit: g.limit, LookAhead: s.cfg.LookAhead}
		var claimed []store.Claimed
		if g.flow != nil {
			var held store.FlowHeld
			req.PerGroup, req.Cluster, req.FairShare, req.Flow = g.flow.GroupConcurrency, g.flow.ClusterConcurrency, g.flow.FairShare, true
			claimed, held, err = s.st.ClaimFlow(cctx, req)
			// Tasks a rate limit held back were moved to when it admits
			// them: wake the claimers then, not at the next poll.
			s.kick.kickAfter(held.Wake)
			s.tel.delayed(ctx, held.Delayed, g.behaviors[0].Behavior)
		} else {
			claimed, err = s.st.Claim(cctx, req)
		}
		cancel()
		s.unreserve(g, claimed, err == nil)
		if err != nil {
			return n, false, err
		}
		s.inc.ok(false)
		s.tel.claimDone(ctx, claimed, time.Since(sent))
		s.startRuns(claimed, sent)
		n += len(claimed)
	}
	s.mu.Lock()
	full = s.slots.free() <= 0
	s.mu.Unlock()
	return n, full, nil
}

// claimGroup is the behaviors one claim statement covers, with the slots
// reserved for it.
type claimGroup struct {
	behaviors []store.BehaviorLease
	limit     int
	flow      *spi.Policy      // the policy of a behavior claimed under flow control
	capped    []api.BehaviorID // behaviors with a per-node cap, reserved against it too
	main      bool             // the claim of every behavior without a tighter cap of its own
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
		left, capped := s.slots.left(b.ID, b.Policy, free)
		switch {
		case left <= 0:
		case flowControlled(b) || runtime[b.ID]:
			p := b.Policy
			groups = append(groups, claimGroup{behaviors: []store.BehaviorLease{bl}, limit: min(left, free),
				flow: &p, capped: []api.BehaviorID{b.ID}})
		case left < free:
			groups = append(groups, claimGroup{behaviors: []store.BehaviorLease{bl}, limit: min(left, free),
				capped: []api.BehaviorID{b.ID}})
		default:
			main.behaviors = append(main.behaviors, bl)
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
func (s *Server) reserve(g claimGroup) (claimGroup, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g.limit = s.slots.reserve(g.limit, g.capped, s.policy)
	if g.limit > 0 {
		s.claiming++
	}
	return g, g.limit > 0
}

// policy returns the policy of a registered behavior.
func (s *Server) policy(b api.BehaviorID) spi.Policy {
	reg, _ := s.cfg.Registry.Lookup(b)
	return reg.Policy
}

// unreserve gives back the slots a claim reserved and did not fill; ok
// tells whether the claim statement succeeded.
func (s *Server) unreserve(g claimGroup, claimed []store.Claimed, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slots.unreserve(g.limit, g.capped, claimed)
	if g.main && ok {
		s.idle = len(claimed) < g.limit
	}
	s.claiming--
	close(s.claimReturned)
	s.claimReturned = make(chan struct{})
}

// sleep waits d or until ctx ends; the loops that call it check ctx next.
func sleep(ctx context.Context, d time.Duration) { _ = spi.Sleep(ctx, d) }
