package api

import (
	"encoding/json"
	"time"
)

// Debounce makes the submits of one task id within a window run once,
// after the stream of submits pauses, but at least once per MaxWait while
// it does not (SubmitRequest.Debounce, WithDebounce). The first debounced
// submit of a cycle (of a new task, of one that finished for good, or the
// first since its last run started) sets the cycle's deadline, its time
// plus MaxWait; each submit of the cycle moves the task's due time to the
// earlier of now plus Window and that deadline, and the last params win
// (or a behavior's spi.Combiner merges them). A running task is flagged to
// run again, a held one is left as it is; docs/debounce.md says what each
// state of the task does. It needs an id that repeats (an explicit
// SubmitRequest.ID, or deterministic ids): it is refused (ErrInvalid) for
// a behavior that gives each task a new id or shares its tasks, with a
// Delay, and for workflow nodes and a run's children.
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
