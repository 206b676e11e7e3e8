package spi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/stinthq/stint/api"
)

// Registry maps behavior ids to behaviors. It is safe for concurrent use.
type Registry struct {
	mu sync.RWMutex
	m  map[api.BehaviorID]*Registration
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{m: map[api.BehaviorID]*Registration{}} }

// Register adds b to r. It fails if the behavior id is malformed or taken.
func Register[P, R any](r *Registry, b Behavior[P, R]) error {
	id := b.Kind().ID
	if err := CheckBehaviorID(id); err != nil {
		return fmt.Errorf("register behavior: %w", err)
	}
	var pol Policy
	if pp, ok := b.(PolicyProvider); ok {
		pol = pp.Policy()
	}
	for _, l := range pol.RateLimits {
		if err := CheckRateLimit(l); err != nil {
			return fmt.Errorf("register behavior %s: rate limit %q: %w", id, l.Name, err)
		}
	}
	if pol.ClusterConcurrency < 0 {
		return fmt.Errorf("register behavior %s: ClusterConcurrency %d is negative", id, pol.ClusterConcurrency)
	}
	if pol.Version < 0 {
		return fmt.Errorf("register behavior %s: Version %d is negative", id, pol.Version)
	}
	reg := &Registration{ID: id, Policy: pol.WithDefaults(), ids: NewIDs(id)}
	reg.decode = func(raw json.RawMessage) (any, error) {
		var p P
		if err := decodeParams(raw, &p); err != nil {
			return nil, err
		}
		return p, nil
	}
	reg.taskID = func(p any) (api.TaskID, bool) {
		var made api.TaskID
		ids := reg.ids
		ids.made = &made
		id := b.TaskID(ids, p.(P))
		return id, made != "" && id == made
	}
	if g, ok := b.(GroupKeyer[P]); ok {
		reg.groupKey = func(p any) string { return g.GroupKey(p.(P)) }
	}
	if l, ok := b.(RateLimiter[P]); ok {
		reg.rateUses = func(p any) []RateUse { return l.RateUses(p.(P)) }
	}
	if d, ok := b.(InitialDelayer[P]); ok {
		reg.initialDelay = func(p any) time.Duration { return max(d.InitialDelay(p.(P)), 0) }
	}
	reg.combine = func(persisted, submitted any) any {
		if c, ok := b.(Combiner[P]); ok {
			return c.Combine(persisted.(P), submitted.(P))
		}
		return persisted
	}
	_, reg.combines = b.(Combiner[P])
	empty := encodesAsEmptyObject(reflect.TypeFor[R]())
	reg.execute = func(ctx context.Context, rc RunContext, p any, failures int) Outcome {
		res, err := b.Run(ctx, rc, p.(P))
		if err == nil {
			raw, merr := emptyObject, error(nil)
			if !empty {
				if raw, merr = json.Marshal(res); merr == nil {
					// A result PostgreSQL refuses would fail its finish
					// again at every run: the run fails for good instead.
					merr = CheckJSONB("result", raw)
				}
			}
			if merr != nil {
				return reg.failure(p, &api.TaskError{Code: "bad_result", Message: "encode result: " + merr.Error()}, rc, failures)
			}
			out := Outcome{Result: raw}
			if s, ok := b.(SuccessRescheduler[P, R]); ok {
				out.Delay, out.Again = s.RescheduleAfterSuccess(p.(P), res)
			}
			return out
		}
		var snooze *SnoozeError
		if errors.As(err, &snooze) {
			return Outcome{Snoozed: true, Again: true, Delay: snooze.Delay}
		}
		var wait *WaitChildrenError
		if errors.As(err, &wait) {
			return Outcome{Snoozed: true, WaitChildren: true, Delay: wait.Max}
		}
		var signal *WaitSignalError
		if errors.As(err, &signal) {
			return Outcome{Snoozed: true, Again: true, Delay: signal.Max, WaitSignal: signal.Topic}
		}
		var tasks *WaitTasksError
		if errors.As(err, &tasks) {
			if len(tasks.IDs) == 0 {
				return Outcome{Snoozed: true, Again: true} // nothing to wait for
			}
			return Outcome{Snoozed: true, Again: true, Delay: tasks.Max, WaitTasks: tasks.IDs}
		}
		return reg.failure(p, AsTaskError(err), rc, failures)
	}
	reg.retry = func(p any, te *api.TaskError, failures int) (time.Duration, bool) {
		if f, ok := b.(FailureRescheduler[P]); ok {
			return f.RescheduleAfterFailure(p.(P), te, failures)
		}
		return 0, false
	}
	_, reg.customRetry = b.(FailureRescheduler[P])
	reg.starter, _ = b.(Starter)
	if s, ok := b.(Scheduler); ok {
		for _, sc := range s.Schedules() {
			if sc.Behavior == "" {
				sc.Behavior = id
			}
			reg.Schedules = append(reg.Schedules, sc)
		}
	}
	reg.secrets = planSecrets(reflect.TypeFor[P]())
	if rd, ok := b.(Redactor[P]); ok {
		reg.redact = func(raw json.RawMessage) (json.RawMessage, error) {
			p, err := reg.decode(raw)
			if err != nil {
				return nil, err
			}
			return json.Marshal(rd.RedactParams(p.(P)))
		}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.m[id]; dup {
		return fmt.Errorf("register behavior %s: already registered", id)
	}
	r.m[id] = reg
	return nil
}

// MustRegister is Register that panics on error, for init-time wiring.
func MustRegister[P, R any](r *Registry, b Behavior[P, R]) {
	if err := Register(r, b); err != nil {
		panic(err)
	}
}

// Merge adds every behavior of from to r, as registered there. It fails,
// adding none, when one of them is registered in r already.
func (r *Registry) Merge(from *Registry) error {
	if r == from {
		return errors.New("merge behaviors: a registry cannot merge itself")
	}
	from.mu.RLock()
	defer from.mu.RUnlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range from.m {
		if _, dup := r.m[id]; dup {
			return fmt.Errorf("register behavior %s: already registered", id)
		}
	}
	for id, reg := range from.m {
		r.m[id] = reg
	}
	return nil
}

// Lookup returns the behavior registered under id.
func (r *Registry) Lookup(id api.BehaviorID) (*Registration, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	reg, ok := r.m[id]
	return reg, ok
}

// IDs returns the registered behavior ids, sorted.
func (r *Registry) IDs() []api.BehaviorID {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]api.BehaviorID, 0, len(r.m))
	for id := range r.m {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Registration is a registered behavior with its types erased: what the
// engine works with.
type Registration struct {
	// ID is the behavior id.
	ID api.BehaviorID
	// Policy is the behavior's policy with defaults applied.
	Policy Policy
	// Schedules are the schedules the behavior declares (Scheduler).
	Schedules []api.Schedule

	ids         IDs
	decode      func(json.RawMessage) (any, error)
	taskID      func(any) (api.TaskID, bool)
	groupKey    func(any) string
	combine     func(persisted, submitted any) any
	combines    bool
	execute     func(ctx context.Context, rc RunContext, p any, failures int) Outcome
	retry       func(p any, te *api.TaskError, failures int) (time.Duration, bool)
	customRetry bool
	starter     Starter
	redact      func(json.RawMessage) (json.RawMessage, error)
	secrets     *secretPlan // where the params hold secrets, nil if nowhere

	// initialDelay is nil unless the behavior is an InitialDelayer.
	initialDelay func(any) time.Duration
	// rateUses is nil unless the behavior is a RateLimiter.
	rateUses func(any) []RateUse
}

// RateLimited reports whether the behavior's tasks may consume rate limits
// (it is a RateLimiter): its claims then enforce them.
func (r *Registration) RateLimited() bool { return r.rateUses != nil }

// RateUses derives the rate limits a task with decoded params p consumes,
// checked: each use names a limit (1 to 128 printable bytes), its key is
// at most MaxGroupKey printable bytes, its units (zero meaning 1) are
// positive, and no limit and key comes twice. Whether the limits exist and
// the units fit them is the engine's to check. Errors are
// *api.InvalidError.
func (r *Registration) RateUses(p any) ([]RateUse, error) {
	if r.rateUses == nil {
		return nil, nil
	}
	uses := r.rateUses(p)
	out := make([]RateUse, 0, len(uses))
	for i, u := range uses {
		field := fmt.Sprintf("rate_uses[%d]", i)
		if err := CheckRateLimitName(field+".limit", u.Limit); err != nil {
			return nil, err
		}
		if len(u.Key) > MaxGroupKey || !Printable(u.Key) {
			return nil, api.Invalid(field+".key", "must be at most %d printable UTF-8 bytes", MaxGroupKey)
		}
		if u.Units == 0 {
			u.Units = 1
		}
		if u.Units < 0 {
			return nil, api.Invalid(field+".units", "%d is negative", u.Units)
		}
		for _, o := range out {
			if o.Limit == u.Limit && o.Key == u.Key {
				return nil, api.Invalid(field, "limit %q and key %q are used twice", u.Limit, u.Key)
			}
		}
		out = append(out, u)
	}
	return out, nil
}

// Start calls the behavior's Starter, if it has one.
func (r *Registration) Start(ctx context.Context, tasks api.Tasks) error {
	if r.starter == nil {
		return nil
	}
	return r.starter.Start(ctx, tasks)
}

// Outcome is what a run decided.
type Outcome struct {
	// Result is the JSON result of a success.
	Result json.RawMessage
	// Err is the error of a failure; nil on success or snooze.
	Err *api.TaskError
	// Snoozed is set when the run asked to be run again later.
	Snoozed bool
	// WaitChildren is set (with Snoozed) when the run waits for its
	// children, at most Delay.
	WaitChildren bool
	// WaitSignal is the topic (with Snoozed and Again) the run sleeps on
	// until a message of it comes, at most Delay.
	WaitSignal string
	// WaitTasks are the tasks (with Snoozed and Again) the run sleeps on
	// until they all ended for good, at most Delay.
	WaitTasks []api.TaskID
	// Again says the task runs again after Delay.
	Again bool
	Delay time.Duration
}

// Decode decodes and validates JSON params, as submitted: their size is
// checked against Policy.MaxParamsBytes. Unknown fields are rejected.
// Errors are *api.InvalidError naming the field.
func (r *Registration) Decode(raw json.RawMessage) (any, error) {
	if len(raw) > r.Policy.MaxParamsBytes {
		return nil, api.Invalid("params", "%d bytes is over the limit of %d", len(raw), r.Policy.MaxParamsBytes)
	}
	return r.decode(raw)
}

// DecodeStored is Decode for params a submit accepted and the database
// stored: their size is not checked again, since the stored form (jsonb,
// which spaces its JSON its own way) may be longer than the submitted one.
// What a submit accepts, a run accepts.
func (r *Registration) DecodeStored(raw json.RawMessage) (any, error) { return r.decode(raw) }

// TaskID derives the id of a task with decoded params p.
func (r *Registration) TaskID(p any) api.TaskID {
	id, _ := r.taskID(p)
	return id
}

// NewTaskID is TaskID that also reports whether the id is new: the one
// IDs.Unique made for this call, which no stored task can have. A new id
// lets the store insert the task without looking for an existing one.
func (r *Registration) NewTaskID(p any) (id api.TaskID, unique bool) { return r.taskID(p) }

// GroupKey derives the group key of a task with decoded params p, or
// returns "" when the behavior does not derive one.
func (r *Registration) GroupKey(p any) string {
	if r.groupKey == nil {
		return ""
	}
	return r.groupKey(p)
}

// InitialDelay returns the delay before the first run of a task with
// decoded params p that the behavior asks for (InitialDelayer), never
// negative; zero when it asks for none.
func (r *Registration) InitialDelay(p any) time.Duration {
	if r.initialDelay == nil {
		return 0
	}
	return r.initialDelay(p)
}

// MaxAttempts returns how many runs a failing task of the behavior gets,
// or 0 when the behavior decides its retries itself (FailureRescheduler).
func (r *Registration) MaxAttempts() int {
	if r.customRetry {
		return 0
	}
	return r.Policy.MaxAttempts
}

// Combines reports whether the behavior merges params of resubmits.
func (r *Registration) Combines() bool { return r.combines }

// Combine merges submitted params into persisted ones, both JSON.
func (r *Registration) Combine(persisted, submitted json.RawMessage) (json.RawMessage, error) {
	pp, err := r.decode(persisted)
	if err != nil {
		return nil, fmt.Errorf("decode persisted params: %w", err)
	}
	sp, err := r.decode(submitted)
	if err != nil {
		return nil, err
	}
	return json.Marshal(r.combine(pp, sp))
}

// Execute runs the behavior on decoded params p and decides what follows.
// failures is the task's count of consecutive failures before this run. A
// panic in Run is returned as a retryable failure.
func (r *Registration) Execute(ctx context.Context, rc RunContext, p any, failures int) (out Outcome) {
	defer func() {
		if v := recover(); v != nil {
			out = r.failure(p, &api.TaskError{Retryable: true, Code: "panic", Message: fmt.Sprint(v)}, rc, failures)
		}
	}()
	return r.execute(ctx, rc, p, failures)
}

// Fail returns the outcome of a run that failed with te, whatever the
// behavior returned: the retry decision applied as for a failure Run
// returned (the engine uses it for a run past its Policy.Timeout).
func (r *Registration) Fail(p any, te *api.TaskError, rc RunContext, failures int) Outcome {
	return r.failure(p, te, rc, failures)
}

// failure applies the retry decision to a failed run.
func (r *Registration) failure(p any, te *api.TaskError, rc RunContext, failures int) Outcome {
	n := failures + 1
	te = storableError(te)
	out := Outcome{Err: te}
	if r.customRetry {
		out.Delay, out.Again = r.retry(p, te, n)
		return out
	}
	if te.Retryable && rc.Attempt() < r.Policy.MaxAttempts {
		out.Again = true
		out.Delay = Backoff(r.Policy.BackoffMin, r.Policy.BackoffMax, n)
	}
	return out
}

// AsTaskError returns err as a *api.TaskError: itself if it is one (or wraps
// one), else a retryable TaskError with its message.
func AsTaskError(err error) *api.TaskError {
	var te *api.TaskError
	if errors.As(err, &te) {
		return te
	}
	return &api.TaskError{Retryable: true, Message: err.Error()}
}
