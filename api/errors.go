package api

import (
	"errors"
	"fmt"
)

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrNotFound is returned for a task id that does not exist.
	ErrNotFound = errors.New("stint: task not found")
	// ErrHalt is returned to a runner whose lease is no longer valid: the
	// task was taken over, removed or released. The runner must stop; its
	// writes changed nothing.
	ErrHalt = errors.New("stint: halt: lease lost")
	// ErrInvalid is wrapped by every error about bad input: unknown
	// behavior, invalid params, bad ids, oversize params.
	ErrInvalid = errors.New("stint: invalid request")
	// ErrUnknownBehavior is returned for a behavior id no registry knows. It
	// wraps ErrInvalid.
	ErrUnknownBehavior = fmt.Errorf("%w: unknown behavior", ErrInvalid)
	// ErrConflict is returned for an operation the task's state does not
	// allow, such as holding a running task.
	ErrConflict = errors.New("stint: task state does not allow this")
	// ErrClosed is returned by a server or client after it was stopped.
	ErrClosed = errors.New("stint: closed")
	// ErrUnavailable is wrapped by the error of a call the database could
	// not serve for a reason of its own rather than the call's: it cannot
	// be reached, is starting, shutting down or in recovery, refuses
	// writes (read-only, a standby, a full disk), or too many connections.
	// Nothing was changed; the same call may succeed later. The error
	// names the cause (see ErrReadOnly).
	ErrUnavailable = errors.New("stint: database unavailable")
	// ErrReadOnly is wrapped, with ErrUnavailable, by the error of a write
	// the database refused because it accepts no writes now: a standby
	// (in recovery, or a primary restarting into recovery), or
	// default_transaction_read_only turned on.
	ErrReadOnly = fmt.Errorf("%w: the database accepts no writes", ErrUnavailable)
)

// InvalidError is bad input, naming the field that is wrong. It wraps
// ErrInvalid (and ErrUnknownBehavior for an unknown behavior).
type InvalidError struct {
	// Field names the offending input, e.g. "params.url" or "id".
	Field string
	// Reason says what is wrong with it.
	Reason string
	// Err is the sentinel matched by errors.Is; ErrInvalid when nil.
	Err error
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason)
}

// Unwrap returns the sentinel the error matches.
func (e *InvalidError) Unwrap() error {
	if e.Err != nil {
		return e.Err
	}
	return ErrInvalid
}

// Invalid returns an *InvalidError for field.
func Invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// TaskError is the error a failed run leaves on its task, and what
// Future.Await returns for a failed task. Behaviors return it to say whether
// a failure is worth retrying; any other error a run returns is stored as a
// retryable TaskError with its message.
type TaskError struct {
	// Retryable says whether the engine may run the task again. Defaults to
	// false, as in Polaris: a behavior opts in to retries of its own errors.
	Retryable bool `json:"retryable"`
	// Code is a short machine-readable reason, e.g. "digest_mismatch".
	Code string `json:"code,omitempty"`
	// Message is the human-readable reason.
	Message string `json:"message"`
	// Properties hold structured details.
	Properties map[string]any `json:"properties,omitempty"`
}

func (e *TaskError) Error() string {
	if e.Code != "" {
		return e.Code + ": " + e.Message
	}
	return e.Message
}

// Permanent returns a TaskError that is never retried.
func Permanent(code, format string, args ...any) *TaskError {
	return &TaskError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Retryable returns a TaskError that may be retried with backoff.
func Retryable(code, format string, args ...any) *TaskError {
	return &TaskError{Retryable: true, Code: code, Message: fmt.Sprintf(format, args...)}
}
