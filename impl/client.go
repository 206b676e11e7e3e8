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
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
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
	// coalesce gathers concurrent single submits into batches.
	coalesce batchQueue[*coalesced]
	// workflows gathers concurrent SubmitWorkflows into batches.
	workflows batchQueue[*coalescedWorkflow]
	// signals gathers concurrent Signals into batches.
	signals batchQueue[*coalescedSignal]
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
	registerBuiltins(cfg.Registry)
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
	if a, ok := st.(databaseAnswerer); ok {
		inc.answered = a.DatabaseAnswered
	}
	if p, ok := st.(databaseProber); ok {
		inc.probe = p.Probe
	}
	h, k := newHub(st, cfg.Logger, inc.listenerState), newKicker(st, cfg.Logger)
	h.self = k.token
	c := &Client{
		st:   st,
		reg:  cfg.Registry,
		cfg:  cfg,
		log:  cfg.Logger,
		hub:  h,
		kick: k,
		tel:  newTelemetry(cfg.TracerProvider, cfg.MeterProvider),
		inc:  inc,
	}
	c.coalesce.kind, c.workflows.kind, c.signals.kind = c.submitBatches(), c.workflowBatches(), c.signalBatches()
	return c, nil
}

// connectionResetter is a store that can find out and drop its dead pooled connections
// (postgres.Store): when the database stops answering they may all be
// dead, and each would cost a statement its deadline.
type connectionResetter interface{ ResetConnections() }

// databaseAnswerer is a store whose listener can be told that the database
// answers again (postgres.Store), so that it listens again at once rather
// than after its backoff or a connection attempt that a silent loss left
// hanging.
type databaseAnswerer interface{ DatabaseAnswered() }

// databaseProber is a store that can ask the database a statement whose
// work does not depend on any payload's size (postgres.Store), to tell a
// slow statement from a database that does not answer (see
// incidents.probe).
type databaseProber interface {
	Probe(ctx context.Context) error
}

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
// out its window of a few milliseconds) and stops the client's listener
// and its logs of database incidents.
// The kicks waiting for delayed tasks to fall due are dropped: the
// claimers' poll finds those tasks.
// Close the client before its store.
func (c *Client) Close() {
	c.kick.close()
	c.hub.close()
	c.inc.close()
}

// Get returns a task or api.ErrNotFound. A due task that waits says on
// what in Task.Waiting: a rate limit or a cap, a paused behavior, no live
// node that runs its behavior, or every such node full.
func (c *Client) Get(ctx context.Context, id api.TaskID) (api.Task, error) {
	if err := spi.CheckTaskID("id", id); err != nil {
		return api.Task{}, err
	}
	t, err := c.st.Get(ctx, id)
	if err == nil {
		c.flowWait(ctx, &t)
		c.nodeWait(ctx, &t)
		err = c.attempts(ctx, &t)
	}
	if err == nil {
		err = c.steps(ctx, &t)
	}
	if err == nil {
		if t.Events, err = c.st.Events(ctx, id, ""); err != nil {
			err = unavailable(err)
		}
	}
	if err == nil {
		if t.Signals, err = c.st.Signals(ctx, id); err != nil {
			err = unavailable(err)
		}
	}
	return t, err
}

// attempts sets the failed runs of t recorded in the store; see
// currentAttempts.
func (c *Client) attempts(ctx context.Context, t *api.Task) error {
	if t.Attempt <= 1 && t.Errors == 0 {
		return nil // no run failed
	}
	rows, err := c.st.Attempts(ctx, t.ID)
	if err != nil {
		return unavailable(err)
	}
	t.Attempts = currentAttempts(*t, rows)
	return nil
}

// currentAttempts returns the recorded failed runs (by attempt) that
// belong to t's current attempts: those below its current attempt, in the
// order they ended and before its current run began, and its current
// attempt's once that run ended. Rows left from before the task's
// attempts started over (a retry by hand, a submit after it finished)
// ended out of that order, or before the current run began, and are left
// out.
func currentAttempts(t api.Task, rows []api.Attempt) []api.Attempt {
	var out []api.Attempt
	var last time.Time
	for _, a := range rows {
		var ok bool
		switch {
		case a.Attempt < t.Attempt:
			ok = a.EndedAt.After(last) && (t.ExecutedAt == nil || !a.EndedAt.After(*t.ExecutedAt))
		case a.Attempt == t.Attempt:
			ok = t.Status != api.StatusRunning && t.ExecutedAt != nil && !a.EndedAt.Before(*t.ExecutedAt) && a.EndedAt.After(last)
		}
		if ok {
			out = append(out, a)
			last = a.EndedAt
		}
	}
	return out
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
	c.versionWaits(ctx, page.Tasks)
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
