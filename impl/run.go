package impl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// run is one claimed task on this node.
type run struct {
	claimed store.Claimed
	reg     *spi.Registration
	lease   time.Duration // the lease the claim issued; renewals extend by it
	started time.Time
	ctx     context.Context
	cancel  context.CancelCauseFunc
	rc      runContext         // what the behavior gets
	end     store.Completion   // how it ended, once it did
	tel     *behaviorTelemetry // counts its start and its end

	// Guarded by Server.mu.
	deadline time.Time        // local lease expiry: the send time of the last renewal + lease
	progress json.RawMessage  // the last checkpoint
	active   time.Time        // the run's start or its last checkpoint or heartbeat
	returned bool             // the behavior returned; its end may not be recorded yet
	freedCap bool             // its return woke the claimers: it freed a slot of a cap across nodes found full lately
	handed   bool             // its return kept its slot for the hand-over of its finish (see handsOver)
	refilled bool             // the hand-over of its finish filled its slot (see capsFreed); set before recorded
	received []int64          // the seq of the messages it received that no checkpoint consumed
	lastSeq  map[string]int64 // by topic, the seq of the last message it received
	at       int              // the run's index in Server.running, -1 once out of it

	// begun is set once a worker begins the run, after the checks that
	// may give its task back unrun: until then the run holds a slot but
	// runs nothing (see rotateLoop).
	begun atomic.Bool
}

// tooLate reports whether the run, not begun yet, is past its first
// lease at now: it must not begin.
func (r *run) tooLate(now time.Time) bool { return now.Sub(r.started) >= r.lease }

// runChunk is how many runs of a claim are allocated together: one
// allocation per run showed in profiles, and a chunk is kept in memory as
// long as any of its runs is, so it stays small.
const runChunk = 32

// startRuns takes a slot for each of claimed and queues them for the
// workers. sent is when the claim was sent: the leases run from no earlier
// than that. The server's lock is taken once for the whole batch.
func (s *Server) startRuns(claimed []store.Claimed, sent time.Time) {
	if len(claimed) == 0 {
		return
	}
	runs := make([]*run, len(claimed))
	var chunk []run
	for i, c := range claimed {
		reg, _ := s.cfg.Registry.Lookup(c.Behavior)
		lease := c.LeaseDuration
		if lease <= 0 {
			lease = reg.Policy.Lease
		}
		if len(chunk) == 0 {
			chunk = make([]run, min(runChunk, len(claimed)-i))
		}
		r := &chunk[0]
		chunk = chunk[1:]
		*r = run{claimed: c, reg: reg, lease: lease, started: sent, deadline: sent.Add(lease), progress: c.Progress, active: sent,
			tel: s.tel.of(c.Behavior)}
		r.tel.ends.starts.Add(1)
		// Runs are not children of a server-wide context: registering
		// each with a parent took a lock shared by all runs and a map
		// write. Stop cancels the runs it gives up on one by one.
		r.ctx, r.cancel = runCtx(reg.Policy.Timeout)
		r.rc = runContext{s: s, r: r}
		runs[i] = r
	}
	s.mu.Lock()
	for _, r := range runs {
		c := &r.claimed
		r.at = len(s.running) // its slot was reserved by the claim
		s.running = append(s.running, r)
		// An older run of the task on this node lost its lease (the task
		// was taken over and claimed again here): it must not go on beside
		// this one.
		if old := s.latest[c.ID]; old != nil {
			old.cancel(fmt.Errorf("task %s: a newer run of it started: %w", c.ID, api.ErrHalt))
		}
		s.latest[c.ID] = r
		l := s.leases[c.Lease]
		l.runs++
		s.leases[c.Lease] = l
		if s.halt != nil {
			r.cancel(s.halt)
		}
	}
	s.mu.Unlock()
	s.runs.Add(len(runs))
	// Runs whose leases ran out before they were queued (this node or the
	// database stalled since the claim was sent) are given back unbegun,
	// in one statement, before the claimer goes on; see execute. Any
	// takeover may find their leases expired meanwhile, and a task taken
	// over counts the claim's attempt although it never began.
	if now := time.Now(); slices.ContainsFunc(runs, func(r *run) bool { return r.tooLate(now) }) {
		var live, stale []*run
		for _, r := range runs {
			if r.tooLate(now) {
				r.cancel(errLeaseExpired)
				stale = append(stale, r)
			} else {
				live = append(live, r)
			}
		}
		s.log.Warn("stint: claimed tasks arrived after their leases ran out (this node or the database stalled); they are given back unrun",
			"tasks", len(stale), "late", now.Sub(sent).Round(time.Millisecond))
		s.giveBack(false, stale...)
		runs = live
	}
	s.queueRuns(runs)
}

// cancelRuns cancels every run with cause, and the runs that start later.
func (s *Server) cancelRuns(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.halt = cause
	for _, r := range s.running {
		r.cancel(cause)
	}
}

// runBase is the parent of every run's context: a run acts on what it
// reads, so its reads see the primary, never a standby that lags.
var runBase = store.ReadPrimary(context.Background())

// runCtx returns the context of a run, a child of runBase, and its cancel
// function: with a deadline timeout from now (cause spi.ErrTimeout) unless
// timeout is zero.
func runCtx(timeout time.Duration) (context.Context, context.CancelCauseFunc) {
	if timeout <= 0 {
		return context.WithCancelCause(runBase)
	}
	timed, stop := context.WithTimeoutCause(runBase, timeout, spi.ErrTimeout)
	ctx, cancel := context.WithCancelCause(timed)
	return ctx, func(cause error) {
		cancel(cause)
		stop() // releases the timer; ctx keeps the cause it ended with
	}
}

// freeSlot gives a run's slot back once its behavior returned. The run
// stays in the running map, its lease renewed, until its end is recorded:
// a slot need not wait for the completion batch.
//
// A run of a behavior that a claim left out at its cap on this node
// (MaxConcurrency, a rotation's MaxRunning) wakes a claimer: the node has
// free slots, so its claimers wait for a wake-up or their poll, not for a
// slot, and nothing else would say that the behavior may be claimed again.
// Only those groups are asked again (see activeGroups), not every idle one.
// So does a run of a behavior whose cap across nodes a claim found full
// lately: its claim counts the runs that returned as ended (see
// store.ClaimRequest.Returned), so it need not wait for the completer to
// record them, a round trip and a durable commit before it went out.
// A run whose end the finish records keeps its slot instead when that
// finish hands it over (see keepSlot).
func (s *Server) freeSlot(r *run) {
	b := r.claimed.Behavior
	s.capsMu.Lock()
	r.freedCap = s.cappedLately(b)
	s.capsMu.Unlock()
	s.mu.Lock()
	s.slots.release(b, r.reg.Policy)
	r.returned = true
	if endsNode(r) {
		// Its finish may start the nodes it makes ready here: the
		// claims leave it room meanwhile (see claimRoom).
		s.localAt = time.Now()
	}
	atCap := s.atCap[b]
	if atCap || r.freedCap {
		delete(s.atCap, b)
		s.forgetEmpty(b)
	}
	s.mu.Unlock()
	signal(s.slotFreed)
	switch {
	case atCap:
		signal(s.capFreed)
	case r.freedCap:
		signal(s.sharedFreed)
	}
}

// endRun forgets a run whose end is recorded (settled) or given up on
// (not settled: the task may still be running under its lease in the
// database); see endRunLocked.
func (s *Server) endRun(r *run, settled bool) {
	r.cancel(context.Canceled)
	s.mu.Lock()
	s.endRunLocked(r, settled)
	s.mu.Unlock()
	s.runs.Done()
}

// endRunLocked forgets a run, and lets its payloads go: its chunk of runs
// (see runChunk) may stay in memory for longer. A lease is dropped once
// its runs all ended, unless one of them was not settled: that lease must
// expire, so that a takeover finds its task.
func (s *Server) endRunLocked(r *run, settled bool) {
	r.claimed.Params, r.claimed.Progress, r.progress, r.end.Result = nil, nil, nil, nil
	if r.at >= 0 {
		// The last run takes r's place.
		last := s.running[len(s.running)-1]
		s.running[r.at], last.at = last, r.at
		s.running[len(s.running)-1] = nil
		s.running = s.running[:len(s.running)-1]
		r.at = -1
	}
	if s.latest[r.claimed.ID] == r {
		delete(s.latest, r.claimed.ID)
	}
	l := s.leases[r.claimed.Lease]
	l.runs--
	l.keep = l.keep || !settled
	if l.runs > 0 {
		s.leases[r.claimed.Lease] = l
	} else {
		delete(s.leases, r.claimed.Lease)
		if !l.keep {
			s.released = append(s.released, r.claimed.Lease)
		}
	}
}

// leaseRuns is what a server knows of one of its leases.
type leaseRuns struct {
	runs int  // runs not ended yet
	keep bool // a run ended without its end recorded: let the lease expire
}

// execute runs a claimed task and records how it ended.
func (s *Server) execute(r *run) {
	// A run not begun within its lease (its node, or the database, stalled
	// between the claim and now) must not begin: its task, and its slot
	// under a cap across nodes, may be another node's by now. Its task is
	// given back instead, due at once.
	if r.tooLate(time.Now()) {
		r.cancel(errLeaseExpired)
		s.giveBack(false, r)
		return
	}
	// Params were validated at submit; validate again, since the behavior's
	// rules may have changed since. A task of a newer version of the
	// behavior than this node's, or whose params name a field this node's
	// params have no place for, was submitted by a newer release: it is
	// left for a node that knows it, rather than failed.
	p, err := r.reg.DecodeStored(r.claimed.Params)
	r.claimed.Params = nil // the run holds its params decoded; the stored form, as big, goes
	if r.claimed.Version > r.reg.Policy.Version || errors.Is(err, spi.ErrUnknownField) {
		s.leaveForNewer(r, err)
		return
	}
	r.begun.Store(true)
	var out spi.Outcome
	ctx, span := s.tel.runStarted(r.ctx, r.claimed, s.cfg.Node)
	if r.reg.Policy.KeepSteps {
		s.tel.resumedStep(ctx, span, s.st, r.claimed)
	}
	if err != nil {
		out = spi.Outcome{Err: &api.TaskError{Code: "invalid_params", Message: err.Error()}}
	} else {
		out = r.reg.Execute(ctx, &r.rc, p, r.claimed.Errors)
		if out.Result == nil && errors.Is(context.Cause(r.ctx), spi.ErrTimeout) {
			out = r.reg.Fail(p, &api.TaskError{Retryable: true, Code: "timeout",
				Message: fmt.Sprintf("run timed out after %s (the behavior's Policy.Timeout)", r.reg.Policy.Timeout)},
				&r.rc, r.claimed.Errors)
		}
	}
	// A run the node stopped (a graceful stop, a rotation, inactivity)
	// records nothing: its task is given back. So is a run that failed
	// after its node cut it off because its lease could not be renewed in
	// time (a slow or unreachable database): the failure is the cut's,
	// not the task's, and must neither count as an attempt nor put the
	// task behind a backoff and every task that became due since. A
	// result it returned all the same is recorded, fenced by the lease as
	// ever: the work was done.
	cause := context.Cause(r.ctx)
	cut := errors.Is(cause, errLeaseExpired) && out.Err != nil
	if cut || errors.Is(cause, errStopping) || errors.Is(cause, spi.ErrPreempted) || errors.Is(cause, spi.ErrInactive) {
		span.SetAttributes(attribute.String("stint.released", cause.Error()))
		span.End()
		// A rotation's stop goes behind the tasks that wait, as does a
		// run without activity (it may hang again); the others keep
		// their place.
		s.giveBack(errors.Is(cause, spi.ErrPreempted) || errors.Is(cause, spi.ErrInactive), r)
		return
	}
	if out.WaitSignal != "" {
		if err := checkName("topic", out.WaitSignal); err != nil {
			out = r.reg.Fail(p, &api.TaskError{Code: "invalid_wait", Message: "wait for signal: " + err.Error()}, &r.rc, r.claimed.Errors)
		} else if out.Delay <= 0 {
			out.Delay = maxRetention // no limit
		}
	}
	out, waits := s.waitTasks(r, p, out)
	c := store.Completion{LeaseRef: r.claimed.LeaseRef, Again: out.Again, Delay: out.Delay,
		WaitChildren: out.WaitChildren, WaitSignal: out.WaitSignal, HasParent: r.claimed.ParentID != ""}
	switch {
	case out.Snoozed:
		c.Status = api.StatusScheduled
	case out.Err != nil:
		c.Status, c.Error = api.StatusFailure, out.Err
	default:
		c.Status, c.Result = api.StatusSuccess, out.Result
	}
	c.WaitTasks = waits
	// A failure consumes nothing: its retry receives what it received.
	if c.Status != api.StatusFailure {
		c.Consumed = r.unconsumed(s)
	}
	s.tel.runEnded(span, c)
	r.end = c
	if !s.keepSlot(r) {
		s.freeSlot(r)
	}
	s.completer.finish(r)
}

// recorded ends the runs of a batch once their ends are recorded (held),
// found fenced out, or given up on (err); until then they stayed in the
// running map, their leases renewed. The server's lock is taken once for
// the batch.
func (s *Server) recorded(batch []*run, held []bool, err error) {
	var again time.Duration // the earliest run again after a delay: a retry, a snooze, a reschedule
	// One line per batch, not per run: an incident can end thousands of
	// runs at once.
	var fenced []api.TaskID
	for i, r := range batch {
		r.cancel(context.Canceled)
		switch {
		case err != nil:
		case !held[i]:
			fenced = append(fenced, r.claimed.ID)
		default:
			r.tel.ended(r.end)
			if r.end.Again && r.end.Delay > 0 && (again == 0 || r.end.Delay < again) {
				again = r.end.Delay
			}
		}
	}
	if err != nil {
		s.log.Error("stint: recording runs failed; their tasks are taken over after their lease", "tasks", len(batch),
			"first", batch[0].claimed.ID, "err", err)
	}
	if len(fenced) > 0 {
		s.log.Info("stint: runs ended after their lease was lost; their results were dropped", "tasks", len(fenced),
			"first", fenced[0])
	}
	s.kick.kickAfter(again)
	var freed, unheard []api.BehaviorID
	if err == nil {
		freed, unheard = s.capsFreed(batch)
	}
	if len(unheard) > 0 {
		// This node's claimers ask again the claims of those behaviors,
		// not every idle group: with a full wake-up, most claims of a
		// node busy under a cap asked its empty main group.
		s.mu.Lock()
		for _, b := range unheard {
			s.forgetEmpty(b)
		}
		s.mu.Unlock()
		signal(s.capFreed)
	}
	if len(freed) > 0 {
		// Slots of caps across nodes are free: the claimers of every
		// node may start tasks they held back.
		s.kick.kickOthers()
	}
	s.mu.Lock()
	for _, r := range batch {
		// A fenced-out run's task is no longer under this lease.
		s.endRunLocked(r, err == nil)
	}
	s.mu.Unlock()
	s.runs.Add(-len(batch))
}
