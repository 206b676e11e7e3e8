package api

import (
	"encoding/json"
	"time"
)

// Debounce makes the submits of one task id within a window run once,
// after the stream of submits pauses, but at least once per MaxWait while
// it does not (SubmitRequest.Debounce, WithDebounce).
//
// The debounced submits of an id form cycles. The first one (of a new
// task, of one that finished for good, or the first since the task's
// last run started) begins a cycle, whose deadline is that submit's time
// plus MaxWait. A debounced submit then:
//
//   - of a task that waits for its next run (scheduled, or waiting to
//     retry or to recur), moves its due time to the earlier of now plus
//     Window and the cycle's deadline (a retry's backoff, if later, is
//     kept), and replaces its params by the submit's (or, when the
//     behavior is an spi.Combiner, merges them), so that the last params
//     win;
//   - of a new task or of one that finished for good, stores it due in
//     Window, as a plain submit would with that delay;
//   - of a running task, flags it to run again, as any submit does (the
//     run's params are kept), due at the earlier of now plus Window and
//     the cycle's deadline, or at the run's end if that is later: the
//     cycle begun during a run counts from its first submit, not from the
//     run's end;
//   - of a held task, changes nothing, as any submit.
//
// A cycle ends when the run it scheduled starts. A plain submit of the id
// sets the due time as it always does, and neither begins nor ends a
// cycle. The deadline holds however long the stream goes on, so that a
// task submitted every Window/2 still runs at least every MaxWait (given
// a free worker).
//
// A debounced submit needs an id that repeats: an explicit
// SubmitRequest.ID, or a behavior that derives deterministic ids. It is
// refused (ErrInvalid) for a behavior that gives each task a new id or
// shares its tasks (spi.DedupShare), with a Delay (the window is the
// delay), and for workflow nodes and children spawned by a run.
type Debounce struct {
	// Window is how long the task waits after the last submit: from 1 ms
	// to MaxWait.
	Window time.Duration
	// MaxWait bounds how long a cycle of submits postpones the task: its
	// deadline is this long after the cycle's first submit. Required:
	// from Window to 366 days (24h*366).
	MaxWait time.Duration
}

// MaxDebounceWait is the largest Debounce.MaxWait.
const MaxDebounceWait = 366 * 24 * time.Hour

// WithDebounce debounces the submit: see Debounce.
func WithDebounce(window, maxWait time.Duration) SubmitOption {
	return func(r *SubmitRequest) { r.Debounce = &Debounce{Window: window, MaxWait: maxWait} }
}

// debounceJSON is Debounce in JSON.
type debounceJSON struct {
	Window  jsonDuration `json:"window"`
	MaxWait jsonDuration `json:"max_wait"`
}

// MarshalJSON encodes d as {"window": "5s", "max_wait": "1m0s"}.
func (d Debounce) MarshalJSON() ([]byte, error) {
	return json.Marshal(debounceJSON{jsonDuration(d.Window), jsonDuration(d.MaxWait)})
}

// UnmarshalJSON decodes d, its durations from duration strings or numbers
// of nanoseconds.
func (d *Debounce) UnmarshalJSON(b []byte) error {
	var v debounceJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*d = Debounce{Window: time.Duration(v.Window), MaxWait: time.Duration(v.MaxWait)}
	return nil
}
