package impl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/buildinfo"
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
	// Version is the version the node reports in the nodes table (`stint
	// nodes ls`, the dashboard's Nodes page). Defaults to stint's module
	// version and commit as the binary's build information records them.
	Version string
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
	// and after a run frees a slot of a cap across nodes, so that claims
	// are batches rather than one statement per task. Defaults to 1
	// millisecond.
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
	// caps, as for a claim; a claim statement in flight holds the slots it
	// reserved until it returns, half of the free ones while this node's
	// own submits start tasks and its claims find no backlog, and should
	// none be free when the last claim found no backlog, the submit waits
	// for it, up to 20 milliseconds); the node's last claim found no
	// backlog (with one, the task would wait behind it anyway); a submit
	// of more tasks than MaxWorkers starts at most half of the free slots'
	// worth, and does not wait; and, checked in the
	// submit statement, the behavior is not paused, its group key is not
	// held, and no due task of its behavior with the same or a higher
	// priority waits for a claim, so that a local start never jumps the
	// claimers' backlog. The submit then stores it running under a lease
	// for this node, as a claim would, and its run starts as a claimed one
	// does. Every other task waits for a claim.
	//
	// In the same way a workflow node whose run ends here starts the
	// nodes that its end makes ready, in the transaction that records it,
	// on up to half of this node's free slots: those of behaviors this
	// node runs that cap nothing (no Policy.MaxConcurrency, Rotation or
	// flow control) and that a claim could take now.
	NoLocalStart bool
	// HandOver turns on the hand-over: the finish of a run of a behavior
	// at a cap that binds (its Policy.MaxConcurrency on this node, or a
	// group key's or the behavior's cap across nodes, found full lately)
	// claims, in its own transaction and under a claim's rules, the next
	// due tasks of the behavior for the slots it frees, and the node
	// starts them at once. Off by default: on two shared cores, where a
	// durable commit costs about what a claim's round trip does, it made
	// capped behaviors no faster (see docs/performance.md).
	HandOver bool
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

// Server runs tasks and, like a Client, submits and awaits them. Create it
// with NewServer, then Start it; Stop it to finish or release its runs.
type Server struct {
	*Client
	cfg ServerConfig
	// newer holds the behaviors and versions ("b@v") of the tasks the
	// node left for a newer release (see leaveForNewer), each logged once.
	newer     sync.Map
	behaviors []*spi.Registration
	minLease  time.Duration
	// schedules are those the behaviors declare, stored at Start.
	schedules []api.Schedule

	wakes     []chan struct{} // one wake-up channel per claimer
	slotFreed chan struct{}
	capFreed  chan struct{} // a run of a behavior in atCap ended
	// sharedFreed: a run of a behavior whose cap across nodes a claim
	// found full lately returned (see freeSlot).
	sharedFreed chan struct{}
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
	// closed (and replaced) when one returns. backlog holds, by claim
	// group (see claimGroup.key), whether the group's last claim found as
	// many tasks as it asked for: a backlog may wait. localAt is when a
	// task last asked to start here without a claim (see startHere), or a
	// run that may make workflow nodes ready returned (see freeSlot). A
	// local start may wait for a claim, up to startWait (localStartWait);
	// startWaiting counts the submits waiting. See reserveStarts and
	// claimRoom.
	claiming      int
	claimReturned chan struct{}
	backlog       map[string]bool
	// taskBytes holds, by claim group, the bytes of params and progress
	// per task that the group's last claim read, or that a failed claim
	// made its next one assume (see claimRoom).
	taskBytes    map[string]int
	localAt      time.Time
	startWait    time.Duration
	startWaiting int

	// flowClaiming holds the behaviors with a claim under flow control in
	// flight: such claims take turns across the cluster, so a second one
	// from this node would only wait behind the first, holding its slots.
	flowClaiming map[api.BehaviorID]bool
	// flowBusy holds the behaviors claimed under flow control whose last
	// claim found tasks; see dueGroups.
	flowBusy map[api.BehaviorID]bool
	// emptyAt holds, by claim group (see claimGroup.key), when its last
	// claim found nothing; see activeGroups.
	emptyAt map[string]time.Time
	// freedAt holds, by behavior, when a run's end last freed a slot its
	// claims were held back for (see forgetEmpty and freedSince).
	freedAt map[api.BehaviorID]time.Time
	// atCap holds the behaviors a claim left out because this node ran as
	// many of them as their cap allows; see freeSlot.
	atCap map[api.BehaviorID]bool

	beatNow     chan struct{}      // asks the lease keeper for a heartbeat now
	checkRuns   chan struct{}      // asks the lease keeper to renew every lease now
	claimCancel context.CancelFunc // stops claiming
	bgCancel    context.CancelFunc // stops the lease keeper and completer
	claimDone   chan struct{}
	bgDone      sync.WaitGroup
	runs        sync.WaitGroup
	localStarts sync.WaitGroup // submits that may start tasks on this node, in flight
	handedOver  atomic.Int64   // tasks the hand-overs of finishes started (see handsOver)
	// nodeStarters are the behaviors whose workflow nodes may start here
	// when a finish makes them ready (see offerNodeStarts).
	nodeStarters []store.BehaviorLease
	completer    *completer

	// capsMu guards caps, the behaviors with caps set at runtime as read
	// at capsRead (see runtimeCaps).
	capsMu   sync.Mutex
	caps     map[api.BehaviorID]bool
	capsRead time.Time
	// cappedAt holds when a claim of a behavior (here, or on a node that
	// said so on store.ChannelCapped) last found a cap across nodes full;
	// noticed, when this node last said so. See capsFreed.
	cappedAt map[api.BehaviorID]time.Time
	noticed  map[api.BehaviorID]time.Time
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
	if cfg.Version == "" {
		cfg.Version = buildinfo.Read().String()
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
	// Every server runs the tasks that stand for workflows and their gate
	// and sub-workflow nodes (registered by NewClient), whatever its
	// behaviors: a workflow ends wherever a slot is free.
	if _, ok := cfg.Registry.Lookup(api.WorkflowBehavior); !ok {
		// A server made at the same time on the same registry may have
		// registered it first; Lookup below finds either one.
		_ = spi.Register[workflowParams, WorkflowResult](cfg.Registry, workflowRunner{})
	}
	ids := slices.Clone(cfg.Behaviors)
	if len(ids) == 0 {
		ids = cfg.Registry.IDs()
	} else {
		for _, b := range builtinBehaviors {
			if !slices.Contains(ids, b) {
				ids = append(ids, b)
			}
		}
	}
	s := &Server{
		Client:        client,
		cfg:           cfg,
		slotFreed:     make(chan struct{}, 1),
		capFreed:      make(chan struct{}, 1),
		sharedFreed:   make(chan struct{}, 1),
		claimReturned: make(chan struct{}),
		startWait:     localStartWait,
		workersDone:   make(chan struct{}),
		latest:        map[api.TaskID]*run{},
		slots:         newSlots(cfg.MaxWorkers),
		leases:        map[[16]byte]leaseRuns{},
		beatNow:       make(chan struct{}, 1),
		checkRuns:     make(chan struct{}, 1),
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
		if p := reg.Policy; !flowControlled(reg) && p.MaxConcurrency == 0 && p.Rotation == nil {
			s.nodeStarters = append(s.nodeStarters, store.BehaviorLease{Behavior: reg.ID, Lease: p.Lease})
		}
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
	var declared []string
	for _, reg := range s.behaviors {
		for _, l := range reg.Policy.RateLimits {
			declared = append(declared, l.Name)
		}
	}
	observeLimits(cfg.MeterProvider, s.Client, declared)
	s.tel.zeroFrom(context.Background(), ids)
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
	// The claimers, the completer and a submit go out side by side as
	// soon as the node starts.
	s.st.Warm(ctx, s.cfg.ClaimConcurrency+2)
	s.hub.setOnDue(s.wakeClaimer)
	s.hub.setOnRemoved(s.cancelRemoved)
	s.hub.setOnCapped(func(b api.BehaviorID) { s.noteCapped(b, false) })
	// A removal or cancel notified while the node did not listen was
	// lost: the node renews every lease once it listens again, and halts
	// the runs whose lease is gone, rather than at their next renewal.
	s.hub.setOnListen(func() { signal(s.checkRuns) })
	s.kick.setLocal(s.wakeClaimer)
	s.hub.start()

	bgCtx, bgCancel := context.WithCancel(context.Background())
	claimCtx, claimCancel := context.WithCancel(context.Background())
	s.bgCancel, s.claimCancel = bgCancel, claimCancel
	s.completer = newCompleter(s.st, s.log, s.inc, s.recorded)
	s.completer.offer = s.offerStarts
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
	var versions map[api.BehaviorID]int
	for _, b := range s.behaviors {
		if b.Policy.Version > 0 {
			if versions == nil {
				versions = map[api.BehaviorID]int{}
			}
			versions[b.ID] = b.Policy.Version
		}
	}
	return s.st.RegisterNode(ctx, store.Node{ID: s.cfg.Node, Host: host, PID: os.Getpid(),
		Behaviors: s.behaviorIDs(), BehaviorVersions: versions, MaxWorkers: s.cfg.MaxWorkers, Version: s.cfg.Version})
}

func (s *Server) behaviorIDs() []api.BehaviorID {
	ids := make([]api.BehaviorID, len(s.behaviors))
	for i, b := range s.behaviors {
		ids[i] = b.ID
	}
	return ids
}

// Stop stops claiming and waits for running tasks to finish until a
// second before ctx's deadline (half the time when it is less than 2 s:
// stopReserve); the runs still going then
// are cancelled and released, due again at once on any node. Runs of
// preemptible behaviors (with a Rotation) are stopped and released at
// once, without waiting. Then the node deregisters. Stop returns by ctx's
// deadline whatever the database does: what is not done by then (a claim
// or a release waiting on a dead connection, a run that ignores its
// cancellation) is abandoned to go on in the background until it fails,
// as it does once the store is closed, and leases not released expire.
// Stop is safe to call when Start failed or never ran (it only closes the
// client then) and more than once, so that `defer srv.Stop(ctx)` may
// follow NewServer.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	if !s.started || s.stopped {
		s.mu.Unlock()
		s.Client.Close()
		return nil
	}
	s.stopped = true
	s.mu.Unlock()

	done := make(chan error, 1)
	go func() { done <- s.stop(ctx) }()
	limit := ctx.Done()
	if ctx.Err() != nil {
		// A context that ended already asks to stop without waiting for
		// the runs, not to abandon their release: they are cancelled and
		// released at once, bounded by the releases' own timeouts.
		grace, cancel := context.WithTimeout(context.WithoutCancel(ctx), endedStopGrace)
		defer cancel()
		limit = grace.Done()
	}
	select {
	case err := <-done:
		return err
	case <-limit:
		s.cancelRuns(errStopping)
		s.bgCancel()
		go s.Client.Close() // its listener stops; a notification it flushes may wait for the database
		return fmt.Errorf("stop server: gave up waiting for claims, runs and the database: %w", context.Cause(ctx))
	}
}

// endedStopGrace bounds a Stop whose context ended before it was called:
// the release of the cancelled runs' leases and the deregistration, 5 s
// each at most.
const endedStopGrace = 11 * time.Second

// stopReserve is the part of Stop's time kept for releasing the leases of
// the runs it cancels and deregistering the node: a second, or half the
// time when Stop has less than 2 s.
func stopReserve(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	return min(time.Second, time.Until(dl)/2)
}

// stop is Stop's work, which ends when the database answers.
func (s *Server) stop(ctx context.Context) error {
	runsCtx, cancelRunsCtx := ctx, context.CancelFunc(func() {})
	if dl, ok := ctx.Deadline(); ok {
		runsCtx, cancelRunsCtx = context.WithDeadline(ctx, dl.Add(-stopReserve(ctx)))
	}
	defer cancelRunsCtx()
	s.claimCancel()
	<-s.claimDone
	s.localStarts.Wait()
	s.stopPreemptible()
	finished := make(chan struct{})
	go func() { s.runs.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-runsCtx.Done():
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

// sleep waits d or until ctx ends; the loops that call it check ctx next.
func sleep(ctx context.Context, d time.Duration) { _ = spi.Sleep(ctx, d) }
