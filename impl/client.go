// Package impl is stint's engine: the Client, which submits, inspects and
// awaits tasks, and the Server, which also claims and runs them.
//
// A Server runs these loops besides its runs: the claimer takes due tasks
// in batches sized to its free worker slots, the lease keeper renews all of
// the node's leases in one statement and cancels runs whose lease is lost,
// the expiry loop cancels runs whose lease ran out locally or whose
// activity timed out (without touching the database), the takeover loop
// makes the tasks of other nodes' expired leases due again, the completer
// records finished runs in batches, and the listener turns PostgreSQL
// notifications into wake-ups (with polling as the fallback). A server's
// own submits start their new due tasks on it at once, without a claim,
// when it has free slots for them (see ServerConfig.NoLocalStart).
//
// Every loop rides through database incidents (a failover, recovery, a
// silent network loss, refused writes): it backs off and tries again,
// never giving up, and reports to the process's incident tracker, which
// logs each incident once when it starts and once when it ends, counts it
// (stint.db.incidents) and reports it with the node's heartbeat.
package impl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// ClientConfig configures a Client.
type ClientConfig struct {
	// Registry holds the behaviors the client may submit: a submit of a
	// behavior it does not hold is refused. Required.
	Registry *spi.Registry
	// PollInterval is how often Await re-reads a task when no notification
	// came. Defaults to 500 milliseconds (Polaris' remote poll).
	PollInterval time.Duration
	// Logger receives the client's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider and MeterProvider receive spans and metrics. Default
	// to OpenTelemetry's global providers, which do nothing until an SDK
	// is installed.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Client submits, inspects and awaits tasks and never runs one. It
// implements api.Tasks.
type Client struct {
	st   store.Store
	reg  *spi.Registry
	cfg  ClientConfig
	log  *slog.Logger
	hub  *hub
	kick *kicker
	tel  *telemetry
	inc  *incidents
	// local is the server of a server's client, which starts due tasks
	// of its own submits at once; nil on a client-only process.
	local starter
	// rates caches the rate limits submits found stored.
	rates rateCache
	// capsChanged, on a server's client, tells the server that a cap was
	// set or removed through it, so that it claims accordingly at once.
	capsChanged func()
}

// starter is a server's part in its own submits: it may start the new
// due tasks of a submit on its node at once (see ServerConfig.NoLocalStart).
type starter interface {
	// Node returns the node id.
	Node() string
	// reserveStarts sets the start lease of each of tasks that may start
	// on the node and reserves its slot. It reports whether it set any;
	// then submitStarted must follow the submit.
	reserveStarts(ctx context.Context, tasks []store.NewTask) bool
	// submitStarted starts the runs of the tasks the submit started
	// (started, in the order of tasks) and gives back the slots of the
	// others. sent is when the submit was sent.
	submitStarted(tasks []store.NewTask, started []store.Claimed, sent time.Time)
}

var _ api.Tasks = (*Client)(nil)

// NewClient returns a client-only Tasks on st. Close it when done.
func NewClient(st store.Store, cfg ClientConfig) (*Client, error) {
	if cfg.Registry == nil {
		return nil, errors.New("new client: ClientConfig.Registry is required")
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 500 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	inc := newIncidents(cfg.Logger, mp)
	if r, ok := st.(connectionResetter); ok {
		inc.unreachable = r.ResetConnections
	}
	return &Client{
		st:   st,
		reg:  cfg.Registry,
		cfg:  cfg,
		log:  cfg.Logger,
		hub:  newHub(st, cfg.Logger, inc.listenerState),
		kick: newKicker(st, cfg.Logger),
		tel:  newTelemetry(cfg.TracerProvider, cfg.MeterProvider),
		inc:  inc,
	}, nil
}

// connectionResetter is a store that can drop its pooled connections
// (postgres.Store): when the database stops answering they may all be
// dead, and each would cost a statement its deadline.
type connectionResetter interface{ ResetConnections() }

// Incidents returns the database incidents going on, as this process
// sees them, and the last one that ended (nil if none).
func (c *Client) Incidents() (open []api.NodeIncident, last *api.NodeIncident) {
	h := c.inc.health()
	return h.Incidents, h.Last
}

// written follows a write of op to the database: on success it ends the
// incidents the success proves over; an error that shows a database
// incident is reported to the tracker and comes back wrapping
// api.ErrUnavailable with its cause (see unavailable). A failure the
// caller's own ctx caused is no incident.
func (c *Client) written(ctx context.Context, op string, err error) error {
	switch {
	case err == nil:
		c.inc.ok(false)
		return nil
	case ctx.Err() != nil:
		return err
	case classify(err) != "":
		c.inc.failed(op, err)
		return unavailable(err)
	}
	return err
}

// ClientStats are counters of a client's work.
type ClientStats struct {
	// Notifications counts the due notifications sent for submits
	// (coalesced: at most one per 5 ms window, plus one at its end).
	Notifications int64
}

// Stats returns the client's counters.
func (c *Client) Stats() ClientStats {
	return ClientStats{Notifications: c.kick.sent.Load()}
}

// Close sends the due notifications still pending (a trailing one waits
// out its window of a few milliseconds) and stops the client's listener.
// The kicks waiting for delayed tasks to fall due are dropped: the
// claimers' poll finds those tasks.
// Close the client before its store.
func (c *Client) Close() {
	c.kick.close()
	c.hub.close()
}

// Limits on the free-form fields of a submit.

// prepare validates a request and turns it into a task to store.
func (c *Client) prepare(req api.SubmitRequest) (store.NewTask, *spi.Registration, error) {
	if err := spi.CheckBehaviorID(req.Behavior); err != nil {
		return store.NewTask{}, nil, err
	}
	reg, ok := c.reg.Lookup(req.Behavior)
	if !ok {
		return store.NewTask{}, nil, &api.InvalidError{Field: "behavior",
			Reason: fmt.Sprintf("%q is not registered", req.Behavior), Err: api.ErrUnknownBehavior}
	}
	params := req.Params
	if len(bytes.TrimSpace(params)) == 0 {
		params = json.RawMessage("{}")
	}
	if len(params) > reg.Policy.MaxParamsBytes {
		return store.NewTask{}, nil, api.Invalid("params", "%d bytes is over the limit of %d", len(params), reg.Policy.MaxParamsBytes)
	}
	if !utf8.Valid(params) {
		return store.NewTask{}, nil, api.Invalid("params", "not valid UTF-8")
	}
	p, err := reg.Decode(params)
	if err != nil {
		return store.NewTask{}, nil, err
	}
	uses, err := rateUsesOf(reg, p)
	if err != nil {
		return store.NewTask{}, nil, err
	}
	if string(params) != "{}" { // the common empty object is compact already
		var compact bytes.Buffer
		if err := json.Compact(&compact, params); err != nil {
			return store.NewTask{}, nil, api.Invalid("params", "bad JSON: %v", err)
		}
		params = compact.Bytes()
	}
	id := req.ID
	derived := id == ""
	if derived {
		id = reg.TaskID(p)
	}
	if err := spi.CheckTaskID("id", id); err != nil {
		if derived {
			// Named only on error: building the name for every task
			// allocated.
			err = spi.CheckTaskID("id (derived by "+string(reg.ID)+")", id)
		}
		return store.NewTask{}, nil, err
	}
	priority := reg.Policy.Priority
	if req.Priority != nil {
		priority = *req.Priority
	}
	if priority < 0 || priority > 32767 {
		return store.NewTask{}, nil, api.Invalid("priority", "%d is outside 0..32767", priority)
	}
	if req.Delay < 0 {
		return store.NewTask{}, nil, api.Invalid("delay", "%s is negative", req.Delay)
	}
	if req.Retention < 0 || req.Retention > maxRetention {
		return store.NewTask{}, nil, api.Invalid("retention", "%s is outside 0..%s", req.Retention, maxRetention)
	}
	if req.Delay == 0 {
		// A delay given at submit takes precedence over the behavior's.
		req.Delay = reg.InitialDelay(p)
	}
	if req.GroupKey == "" {
		req.GroupKey = reg.GroupKey(p)
	}
	if req.GroupKey != "" {
		if err := spi.CheckGroupKey("group_key", req.GroupKey); err != nil {
			return store.NewTask{}, nil, err
		}
	}
	if err := spi.CheckTrace(req.Trace); err != nil {
		return store.NewTask{}, nil, err
	}
	return store.NewTask{
		ID:        id,
		Behavior:  req.Behavior,
		Params:    params,
		Priority:  priority,
		Delay:     req.Delay,
		GroupKey:  req.GroupKey,
		Trace:     req.Trace,
		Notify:    req.Notify,
		Share:     reg.Policy.Dedup == spi.DedupShare,
		Retention: req.Retention,
		RateUses:  uses,
	}, reg, nil
}

// maxRetention caps SubmitRequest.Retention: a task kept longer is kept
// for good in all but name, and the database's timestamps end.
const maxRetention = 100 * 365 * 24 * time.Hour

// Submit validates and stores one task; see api.Tasks.
// A submit the database cannot serve (down, in recovery, refusing writes)
// fails with an error wrapping api.ErrUnavailable that names the cause,
// and stores nothing.
func (c *Client) Submit(ctx context.Context, req api.SubmitRequest) (api.Submission, error) {
	sub, err := c.submit(ctx, nil, req)
	return sub, c.written(ctx, "submit", err)
}

// SubmitTx is Submit in the caller's transaction tx, which may hold the
// caller's own writes: the task exists if and only if tx commits, and the
// claimers are notified at the commit. Until then nobody sees the task.
// Dedup and validation are Submit's. tx may run on a connection through
// PgBouncer in transaction mode.
func (c *Client) SubmitTx(ctx context.Context, tx pgx.Tx, req api.SubmitRequest) (api.Submission, error) {
	if tx == nil {
		return api.Submission{}, fmt.Errorf("submit %s: %w", req.Behavior, api.Invalid("tx", "is nil"))
	}
	sub, err := c.submit(ctx, tx, req)
	return sub, c.written(ctx, "submit", err)
}

// submit stores one task, in tx or, when tx is nil, on its own.
func (c *Client) submit(ctx context.Context, tx pgx.Tx, req api.SubmitRequest) (sub api.Submission, err error) {
	ctx, span := c.tel.startSubmit(ctx, req.Behavior, 1)
	defer func() { endSpan(span, err) }()
	if req.Trace == "" {
		req.Trace = c.tel.traceparent(ctx)
	}
	t, reg, err := c.prepare(req)
	if err != nil {
		return api.Submission{}, fmt.Errorf("submit %s: %w", req.Behavior, err)
	}
	if len(t.RateUses) > 0 {
		if err := c.checkRateUses(ctx, []store.NewTask{t}, []*spi.Registration{reg}); err != nil {
			return api.Submission{}, fmt.Errorf("submit %s: %w", req.Behavior, err)
		}
	}
	span.SetAttributes(attribute.String("stint.task_id", string(t.ID)))
	led, due := false, false
	if reg.Combines() && !t.Share {
		// In a caller's transaction the statement always notifies: the
		// notification goes out at the commit, which the coalescing of
		// notifications across submits cannot see.
		due = t.Delay == 0
		t.WakeClaimers = due && (tx != nil || c.kick.lead())
		led = t.WakeClaimers
		combine := func(persisted json.RawMessage) (json.RawMessage, error) { return reg.Combine(persisted, t.Params) }
		if tx != nil {
			sub, err = c.st.SubmitCombinedTx(ctx, tx, t, combine)
		} else {
			sub, err = c.st.SubmitCombined(ctx, t, combine)
		}
	} else {
		var subs []api.Submission
		subs, led, due, err = c.storePlain(ctx, tx, []store.NewTask{t}, false)
		if err == nil {
			sub = subs[0]
		}
	}
	if err != nil {
		return api.Submission{}, err
	}
	c.tel.submitted.Add(ctx, 1, c.tel.behavior(t.Behavior)...)
	if tx == nil {
		c.kick.stored(due, led, t.Delay)
	}
	return sub, nil
}

// earliestDelay returns the shortest delay of tasks that have one, or zero.
func earliestDelay(tasks []store.NewTask) time.Duration {
	var d time.Duration
	for _, t := range tasks {
		if t.Delay > 0 && (d == 0 || t.Delay < d) {
			d = t.Delay
		}
	}
	return d
}

// storePlain stores tasks that no Combiner merges, in tx or, when tx is
// nil, on their own. On a server's client, outside a transaction, the
// tasks the server may start at once are stored running on its node and
// their runs started (see store.Store.SubmitStart); the others wait for a
// claim. due reports whether a task due now was left to the claimers (or
// alsoDue said that another task of the submit is due): the statement
// then notified them if led, or in tx at the commit; otherwise the caller
// kicks the claimers.
func (c *Client) storePlain(ctx context.Context, tx pgx.Tx, tasks []store.NewTask, alsoDue bool) (subs []api.Submission, led, due bool, err error) {
	local := tx == nil && c.local != nil && c.local.reserveStarts(ctx, tasks)
	due = alsoDue || slices.ContainsFunc(tasks, func(t store.NewTask) bool { return t.Delay == 0 && t.StartLease == 0 })
	if tx != nil {
		// In a caller's transaction the statement always notifies: the
		// notification goes out at the commit, which the coalescing of
		// notifications across submits cannot see.
		tasks[0].WakeClaimers = due
		subs, err = c.st.SubmitTx(ctx, tx, tasks)
		return subs, false, due, err
	}
	led = due && c.kick.lead()
	tasks[0].WakeClaimers = led
	if !local {
		subs, err = c.st.Submit(ctx, tasks)
		return subs, led, due, err
	}
	sent := time.Now()
	subs, started, err := c.st.SubmitStart(ctx, c.local.Node(), tasks)
	c.local.submitStarted(tasks, started, sent)
	// A task the server meant to start and the statement did not (its id
	// existed, its behavior is paused, ...) waits for a claim.
	starting := 0
	for _, t := range tasks {
		if t.StartLease > 0 {
			starting++
		}
	}
	return subs, led, due || len(started) < starting, err
}

// SubmitMany validates all requests, then stores them in one statement. If
// any request is invalid, none is stored. Behaviors with a Combiner are
// merged one by one after the statement.
func (c *Client) SubmitMany(ctx context.Context, reqs []api.SubmitRequest) ([]api.Submission, error) {
	subs, err := c.submitMany(ctx, nil, reqs)
	return subs, c.written(ctx, "submit", err)
}

// SubmitManyTx is SubmitMany in the caller's transaction tx; see SubmitTx.
func (c *Client) SubmitManyTx(ctx context.Context, tx pgx.Tx, reqs []api.SubmitRequest) ([]api.Submission, error) {
	if tx == nil {
		return nil, fmt.Errorf("submit many: %w", api.Invalid("tx", "is nil"))
	}
	subs, err := c.submitMany(ctx, tx, reqs)
	return subs, c.written(ctx, "submit", err)
}

// submitMany stores tasks, in tx or, when tx is nil, on their own.
func (c *Client) submitMany(ctx context.Context, tx pgx.Tx, reqs []api.SubmitRequest) (_ []api.Submission, err error) {
	behavior := api.BehaviorID("")
	if len(reqs) > 0 {
		behavior = reqs[0].Behavior
	}
	ctx, span := c.tel.startSubmit(ctx, behavior, len(reqs))
	defer func() { endSpan(span, err) }()
	trace := c.tel.traceparent(ctx)
	tasks := make([]store.NewTask, 0, len(reqs))
	regs := make([]*spi.Registration, 0, len(reqs))
	index := make([]int, len(reqs)) // request i -> tasks[index[i]]
	seen := make(map[api.TaskID]int, len(reqs))
	for i, req := range reqs {
		if req.Trace == "" {
			req.Trace = trace
		}
		t, reg, err := c.prepare(req)
		if err != nil {
			return nil, fmt.Errorf("submit many: request %d (%s): %w", i, req.Behavior, err)
		}
		// One statement cannot touch a row twice: repeats of an id in one
		// call share the first request's submission.
		if j, dup := seen[t.ID]; dup {
			index[i] = j
			continue
		}
		seen[t.ID] = len(tasks)
		index[i] = len(tasks)
		tasks = append(tasks, t)
		regs = append(regs, reg)
	}
	if slices.ContainsFunc(tasks, func(t store.NewTask) bool { return len(t.RateUses) > 0 }) {
		if err := c.checkRateUses(ctx, tasks, regs); err != nil {
			return nil, fmt.Errorf("submit many: %w", err)
		}
	}
	var plain []store.NewTask
	var plainAt []int
	for i, t := range tasks {
		if !regs[i].Combines() || t.Share {
			plain = append(plain, t)
			plainAt = append(plainAt, i)
		}
	}
	subs := make([]api.Submission, len(tasks))
	// Only tasks due now wake claimers; delayed ones are found when due,
	// and those started at once need no claim.
	combinedDue := false
	for i, t := range tasks {
		combinedDue = combinedDue || (regs[i].Combines() && !t.Share && t.Delay == 0)
	}
	led, due := false, combinedDue
	if len(plain) > 0 {
		var got []api.Submission
		got, led, due, err = c.storePlain(ctx, tx, plain, combinedDue && tx == nil)
		if err != nil {
			return nil, err
		}
		for k, i := range plainAt {
			subs[i] = got[k]
		}
	}
	for i, t := range tasks {
		if regs[i].Combines() && !t.Share {
			// The closure captures copies made here, not the loop's t:
			// capturing t would move every task of the loop to the heap,
			// one allocation per task.
			reg, params := regs[i], t.Params
			combine := func(persisted json.RawMessage) (json.RawMessage, error) { return reg.Combine(persisted, params) }
			var sub api.Submission
			if tx != nil {
				sub, err = c.st.SubmitCombinedTx(ctx, tx, t, combine)
			} else {
				sub, err = c.st.SubmitCombined(ctx, t, combine)
			}
			if err != nil {
				return nil, err
			}
			subs[i] = sub
		}
	}
	per := map[api.BehaviorID]int64{}
	for _, t := range tasks {
		per[t.Behavior]++
	}
	for b, n := range per {
		c.tel.submitted.Add(ctx, n, c.tel.behavior(b)...)
	}
	if tx == nil {
		c.kick.stored(due, led, earliestDelay(tasks))
	}
	out := make([]api.Submission, len(reqs))
	for i := range reqs {
		out[i] = subs[index[i]]
	}
	return out, nil
}

// Get returns a task or api.ErrNotFound.
func (c *Client) Get(ctx context.Context, id api.TaskID) (api.Task, error) {
	if err := spi.CheckTaskID("id", id); err != nil {
		return api.Task{}, err
	}
	t, err := c.st.Get(ctx, id)
	if err == nil {
		c.flowWait(ctx, &t)
	}
	return t, err
}

// List returns a page of tasks; see api.Tasks.
func (c *Client) List(ctx context.Context, f api.Filter) (api.Page, error) {
	if f.Status != "" && !f.Status.Valid() {
		return api.Page{}, api.Invalid("status", "%q is not a task status", f.Status)
	}
	if f.Limit < 0 || f.Limit > 1000 {
		return api.Page{}, api.Invalid("limit", "%d is outside 0..1000", f.Limit)
	}
	page, err := c.st.List(ctx, f)
	if err != nil {
		return page, err
	}
	c.flowWaits(ctx, page.Tasks)
	return page, nil
}

// awaitPrimaryEvery is how many of Await's polls go to the standby (when
// the store has one) for each that goes to the primary.
const awaitPrimaryEvery = 10

// Await waits until the task is finished; see api.Tasks. It wakes on the
// finish notification and re-reads the task every PollInterval in case a
// notification was lost. It rides through a lost database connection (a
// terminated backend, a PostgreSQL restart, a failover): transient errors
// are retried with backoff (from PollInterval up to 5 seconds) until ctx
// ends; only api.ErrNotFound, ctx's error and errors that a retry cannot
// cure (such as a missing privilege) are returned.
//
// With a store that reads from a standby, a lagging standby never makes
// Await wrong or stuck: its first read, and the read after each finish
// notification, go to the primary (store.ReadPrimary), and only the
// polls in between go to the standby, of which every tenth goes to the
// primary too. So a task that finished is seen at once when the
// notification comes, and within ten poll intervals when it is lost.
func (c *Client) Await(ctx context.Context, id api.TaskID) (api.Task, error) {
	if err := spi.CheckTaskID("id", id); err != nil {
		return api.Task{}, err
	}
	wake, stop := c.hub.wait(id)
	defer stop()
	marked := false
	poll := time.NewTicker(c.cfg.PollInterval)
	defer poll.Stop()
	failures, polls := 0, 0
	primary := true // the next read goes to the primary
	for {
		var t api.Task
		var err error
		readCtx := ctx
		if primary {
			readCtx = store.ReadPrimary(ctx)
		}
		// Set the awaited flag so the finish notifies, unless the submit
		// did. The write serializes with a concurrent finish: either we
		// see the finished row, or the finish sees the flag.
		if t, err = c.st.Get(readCtx, id); err == nil && !t.Finished() && !t.Notify && !marked {
			t, err = c.st.MarkAwaited(ctx, id)
			marked = err == nil
		}
		switch {
		case err == nil && t.Finished():
			return t, nil
		case err == nil:
			failures = 0
			select {
			case <-ctx.Done():
				return api.Task{}, fmt.Errorf("await task %s: %w", id, ctx.Err())
			case <-wake:
				primary = true
			case <-poll.C:
				polls++
				primary = polls%awaitPrimaryEvery == 0
			}
		case ctx.Err() != nil:
			return api.Task{}, fmt.Errorf("await task %s: %w", id, ctx.Err())
		case !transient(err):
			return t, err
		default:
			failures++
			if failures == 1 || failures%10 == 0 {
				c.log.Warn("stint: await: reading the task failed; retrying", "task", id, "failures", failures, "err", err)
			}
			if err := spi.Sleep(ctx, spi.Backoff(c.cfg.PollInterval, 5*time.Second, failures)); err != nil {
				return api.Task{}, fmt.Errorf("await task %s: %w", id, ctx.Err())
			}
		}
	}
}

// endSpan ends a span, recording err.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
