package api

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Kind names a behavior together with its params and result types, so that
// Submit and Future.Await are type-checked. Behaviors export their Kind.
type Kind[P, R any] struct {
	// ID is the behavior id.
	ID BehaviorID
}

// SubmitOption adjusts a typed Submit.
type SubmitOption func(*SubmitRequest)

// WithID sets the task id instead of the one the behavior derives.
func WithID(id TaskID) SubmitOption { return func(r *SubmitRequest) { r.ID = id } }

// WithPriority sets the priority; lower runs first.
func WithPriority(p int) SubmitOption { return func(r *SubmitRequest) { r.Priority = &p } }

// WithDelay postpones the first run by d.
func WithDelay(d time.Duration) SubmitOption { return func(r *SubmitRequest) { r.Delay = d } }

// WithGroupKey sets the group key (the scope of holds and limits).
func WithGroupKey(k string) SubmitOption { return func(r *SubmitRequest) { r.GroupKey = k } }

// WithTrace sets the W3C traceparent stored with the task.
func WithTrace(tp string) SubmitOption { return func(r *SubmitRequest) { r.Trace = tp } }

// Future is a submitted task whose typed result can be awaited.
type Future[R any] struct {
	tasks      Tasks
	submission Submission
}

// Submit submits a task of kind k with params p. The returned Future awaits
// the typed result. Submit asks for a finish notification, expecting the
// result to be awaited.
func Submit[P, R any](ctx context.Context, t Tasks, k Kind[P, R], p P, opts ...SubmitOption) (*Future[R], error) {
	return SubmitWith(ctx, t, t.Submit, k, p, opts...)
}

// SubmitWith is Submit with the submitting step given: submit stores the
// request (for example in a caller's transaction), and the returned Future
// awaits the task through t.
func SubmitWith[P, R any](ctx context.Context, t Tasks, submit func(context.Context, SubmitRequest) (Submission, error), k Kind[P, R], p P, opts ...SubmitOption) (*Future[R], error) {
	raw, err := json.Marshal(p)
	if err != nil {
		return nil, &InvalidError{Field: "params", Reason: err.Error()}
	}
	req := SubmitRequest{Behavior: k.ID, Params: raw, Notify: true}
	for _, o := range opts {
		o(&req)
	}
	s, err := submit(ctx, req)
	if err != nil {
		return nil, err
	}
	return &Future[R]{tasks: t, submission: s}, nil
}

// NewFuture returns a Future for an existing task id, to await a task
// submitted elsewhere.
func NewFuture[P, R any](t Tasks, k Kind[P, R], id TaskID) *Future[R] {
	return &Future[R]{tasks: t, submission: Submission{ID: id}}
}

// ID returns the task id.
func (f *Future[R]) ID() TaskID { return f.submission.ID }

// Submission returns what the submit did.
func (f *Future[R]) Submission() Submission { return f.submission }

// Await waits for the task to finish. It returns the typed result of a
// success, or the *TaskError of a failure. The result is decoded
// leniently: fields R has no place for (a newer release's) are left out;
// a result that does not decode says which version of its behavior wrote
// it.
func (f *Future[R]) Await(ctx context.Context) (R, error) {
	var r R
	t, err := f.tasks.Await(ctx, f.submission.ID)
	if err != nil {
		return r, err
	}
	if t.Status == StatusFailure {
		if t.Error == nil {
			return r, &TaskError{Message: "task failed without an error"}
		}
		return r, t.Error
	}
	if err := json.Unmarshal(t.Result, &r); err != nil {
		return r, fmt.Errorf("decode result of task %s (%s version %d): %w", t.ID, t.Behavior, t.Version, err)
	}
	return r, nil
}
