package impl

// The Client's submits: checking a request, storing its task (or many in
// one statement), and waking the claimers.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// Limits on the free-form fields of a submit.

// prepare validates a request and turns it into a task to store. It
// refuses a debounced request: only Submit and SubmitMany debounce (see
// prepareSubmit).
func (c *Client) prepare(req api.SubmitRequest) (store.NewTask, *spi.Registration, error) {
	if req.Debounce != nil {
		return store.NewTask{}, nil, api.Invalid("debounce", "only a submit of a task debounces, not a workflow's node nor a run's child")
	}
	if err := spi.CheckBehaviorID(req.Behavior); err != nil {
		return store.NewTask{}, nil, err
	}
	if req.Behavior == api.WorkflowBehavior {
		return store.NewTask{}, nil, api.Invalid("behavior", "%s tasks are stored with their workflow (SubmitWorkflow), never alone", req.Behavior)
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
	id, unique := req.ID, false
	derived := id == ""
	if derived {
		id, unique = reg.NewTaskID(p)
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
	retention, err := checkRetention(req.Retention)
	if err != nil {
		return store.NewTask{}, nil, err
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
		Retention: retention,
		RateUses:  uses,
		Unique:    unique,
		Version:   reg.Policy.Version,
	}, reg, nil
}

// prepareSubmit is prepare for Submit and SubmitMany, which also take a
// debounced request (api.Debounce): its Window becomes the task's Delay.
func (c *Client) prepareSubmit(req api.SubmitRequest) (store.NewTask, *spi.Registration, error) {
	d := req.Debounce
	if d == nil {
		return c.prepare(req)
	}
	switch {
	case d.Window < time.Millisecond:
		return store.NewTask{}, nil, api.Invalid("debounce.window", "%s is under 1ms", d.Window)
	case d.MaxWait < d.Window:
		return store.NewTask{}, nil, api.Invalid("debounce.max_wait", "%s is under the window, %s", d.MaxWait, d.Window)
	case d.MaxWait > api.MaxDebounceWait:
		return store.NewTask{}, nil, api.Invalid("debounce.max_wait", "%s is over the limit of %s", d.MaxWait, api.MaxDebounceWait)
	case req.Delay != 0:
		return store.NewTask{}, nil, api.Invalid("delay", "a debounced submit is due after its window; give a delay or a debounce, not both")
	}
	req.Debounce = nil
	t, reg, err := c.prepare(req)
	if err != nil {
		return store.NewTask{}, nil, err
	}
	switch {
	case t.Share:
		return store.NewTask{}, nil, api.Invalid("debounce", "%s shares its tasks (DedupShare): a submit never changes a stored one", reg.ID)
	case t.Unique:
		return store.NewTask{}, nil, api.Invalid("debounce", "%s gives every task a new id, which no later submit repeats: give the id (SubmitRequest.ID)", reg.ID)
	}
	t.Delay, t.Debounce = d.Window, d
	return t, reg, nil
}

// maxRetention caps SubmitRequest.Retention: a task kept longer is kept
// for good in all but name, and the database's timestamps end.
const maxRetention = 100 * 365 * 24 * time.Hour

// checkRetention checks the retention d of a submit and returns the one
// to store: the database keeps times to the microsecond, so a positive
// retention shorter than that is the shortest it keeps, not none.
func checkRetention(d time.Duration) (time.Duration, error) {
	if d < 0 || d > maxRetention {
		return 0, api.Invalid("retention", "%s is outside 0..%s", d, maxRetention)
	}
	if 0 < d && d < time.Microsecond {
		return time.Microsecond, nil
	}
	return d, nil
}

// Submit validates and stores one task; see api.Tasks.
// A submit the database cannot serve (down, in recovery, refusing writes)
// fails with an error wrapping api.ErrUnavailable that names the cause,
// and stores nothing.
//
// Concurrent Submits of one Client share statements: each joins a batch
// that goes out as one statement and one commit, at once when no batch of
// the Client is in the database (so a lone submit goes out alone, without
// waiting) or when it holds 1,000 submits, and otherwise as soon as the
// batches in the database return. Each caller still gets its own
// submission or error, and only once its task is committed: a submit
// refused by its own checks never joins a batch, and a row the database
// refuses fails that submit alone (the batch is sent again in parts). Two
// submits of one id never share a batch, so they deduplicate as two
// submits one after the other do. If ctx ends before the batch goes out,
// the task is not stored and Submit returns ctx's error; once the batch is
// in the database, Submit waits for it and returns its outcome even if ctx
// ends meanwhile, so that an error wrapping ctx's always means that the
// task was not stored. A
// behavior with a Combiner (unless it shares its tasks) is submitted on
// its own, as is a debounced submit (SubmitRequest.Debounce).
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
	t, reg, err := c.prepareSubmit(req)
	if err != nil {
		return api.Submission{}, fmt.Errorf("submit %s: %w", req.Behavior, err)
	}
	if len(t.RateUses) > 0 {
		if err := c.checkRateUses(ctx, []store.NewTask{t}, []*spi.Registration{reg}); err != nil {
			return api.Submission{}, fmt.Errorf("submit %s: %w", req.Behavior, err)
		}
	}
	span.SetAttributes(attribute.String("stint.task_id", string(t.ID)))
	if tx == nil && !alone(t, reg) {
		// The batch counts the task and wakes the claimers.
		return c.submitCoalesced(ctx, t)
	}
	led, due := false, false
	if alone(t, reg) {
		// In a caller's transaction the statement always notifies: the
		// notification goes out at the commit, which the coalescing of
		// notifications across submits cannot see.
		due = t.Delay == 0
		t.WakeClaimers = due && (tx != nil || c.kick.lead())
		led = t.WakeClaimers
		sub, err = c.storeAlone(ctx, tx, t, reg)
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

// alone reports whether task t of reg is stored on its own, not in a
// statement of many: a debounced task, or one whose params the behavior
// combines (unless it shares its tasks).
func alone(t store.NewTask, reg *spi.Registration) bool {
	return t.Debounce != nil || (reg.Combines() && !t.Share)
}

// storeAlone stores a task that alone says is stored on its own, in tx
// or, when tx is nil, on its own.
func (c *Client) storeAlone(ctx context.Context, tx pgx.Tx, t store.NewTask, reg *spi.Registration) (api.Submission, error) {
	var combine func(json.RawMessage) (json.RawMessage, error)
	if reg.Combines() {
		// The closure captures a copy of the params, not t: capturing t
		// would move every task of SubmitMany's loop to the heap.
		params := t.Params
		combine = func(persisted json.RawMessage) (json.RawMessage, error) { return reg.Combine(persisted, params) }
	}
	if tx != nil {
		return c.st.SubmitCombinedTx(ctx, tx, t, combine)
	}
	return c.st.SubmitCombined(ctx, t, combine)
}

// countSubmitted counts tasks in the submitted metric, per behavior.
func (c *Client) countSubmitted(ctx context.Context, tasks []store.NewTask) {
	if len(tasks) == 1 {
		c.tel.submitted.Add(ctx, 1, c.tel.behavior(tasks[0].Behavior)...)
		return
	}
	per := map[api.BehaviorID]int64{}
	for _, t := range tasks {
		per[t.Behavior]++
	}
	for b, n := range per {
		c.tel.submitted.Add(ctx, n, c.tel.behavior(b)...)
	}
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
// merged, and debounced requests stored, one by one after the statement.
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
		t, reg, err := c.prepareSubmit(req)
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
	// The tasks stored in one statement, and where each is in tasks; most
	// often all of them, which are not copied then.
	plain, plainAt := tasks, []int(nil)
	someAlone := false
	for i, t := range tasks {
		someAlone = someAlone || alone(t, regs[i])
	}
	if someAlone {
		plain = nil
		for i, t := range tasks {
			if !alone(t, regs[i]) {
				plain = append(plain, t)
				plainAt = append(plainAt, i)
			}
		}
	}
	subs := make([]api.Submission, len(tasks))
	// Only tasks due now wake claimers; delayed ones are found when due,
	// and those started at once need no claim.
	combinedDue := false
	for i, t := range tasks {
		combinedDue = combinedDue || (alone(t, regs[i]) && t.Delay == 0)
	}
	led, due := false, combinedDue
	if len(plain) > 0 {
		var got []api.Submission
		got, led, due, err = c.storePlain(ctx, tx, plain, combinedDue && tx == nil)
		if err != nil {
			return nil, err
		}
		if plainAt == nil {
			copy(subs, got)
		}
		for k, i := range plainAt {
			subs[i] = got[k]
		}
	}
	for i, t := range tasks {
		if alone(t, regs[i]) {
			if subs[i], err = c.storeAlone(ctx, tx, t, regs[i]); err != nil {
				return nil, err
			}
		}
	}
	c.countSubmitted(ctx, tasks)
	if tx == nil {
		c.kick.stored(due, led, earliestDelay(tasks))
	}
	out := make([]api.Submission, len(reqs))
	for i := range reqs {
		out[i] = subs[index[i]]
	}
	return out, nil
}
