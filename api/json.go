package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// In JSON, every duration of this package (Task.Retention,
// SubmitRequest.Delay, RateLimit.Period, ...) is a string in Go's duration
// syntax, as time.Duration.String writes it ("1m0s", "1h30m0s", "250ms"),
// the syntax time.ParseDuration reads and submits take. On input a whole
// number of nanoseconds is accepted too, the form of earlier releases.

// jsonDuration is a time.Duration in JSON: written as a Go duration string,
// read from one or from a whole number of nanoseconds.
type jsonDuration time.Duration

// MarshalJSON writes d as a Go duration string.
func (d jsonDuration) MarshalJSON() ([]byte, error) {
	return strconv.AppendQuote(nil, time.Duration(d).String()), nil
}

// UnmarshalJSON reads a Go duration string or a whole number of
// nanoseconds; null leaves d as it is.
func (d *jsonDuration) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case string(b) == "null":
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%q is not a duration such as \"90s\" or \"1h30m\"", s)
		}
		*d = jsonDuration(v)
		return nil
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("%s is neither a duration such as \"90s\" nor a whole number of nanoseconds", b)
	}
	*d = jsonDuration(n)
	return nil
}

// MarshalJSON encodes t, its Retention as a duration string.
func (t Task) MarshalJSON() ([]byte, error) {
	type plain Task
	return json.Marshal(struct {
		plain
		Retention jsonDuration `json:"retention,omitempty"`
	}{plain(t), jsonDuration(t.Retention)})
}

// UnmarshalJSON decodes t, its Retention from a duration string or a
// number of nanoseconds.
func (t *Task) UnmarshalJSON(b []byte) error {
	type plain Task
	v := struct {
		*plain
		Retention jsonDuration `json:"retention,omitempty"`
	}{plain: (*plain)(t)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	t.Retention = time.Duration(v.Retention)
	return nil
}

// MarshalJSON encodes r, its Delay and Retention as duration strings.
func (r SubmitRequest) MarshalJSON() ([]byte, error) {
	type plain SubmitRequest
	return json.Marshal(struct {
		plain
		Delay     jsonDuration `json:"delay,omitempty"`
		Retention jsonDuration `json:"retention,omitempty"`
	}{plain(r), jsonDuration(r.Delay), jsonDuration(r.Retention)})
}

// UnmarshalJSON decodes r, its Delay and Retention from duration strings
// or numbers of nanoseconds.
func (r *SubmitRequest) UnmarshalJSON(b []byte) error {
	type plain SubmitRequest
	v := struct {
		*plain
		Delay     jsonDuration `json:"delay,omitempty"`
		Retention jsonDuration `json:"retention,omitempty"`
	}{plain: (*plain)(r)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	r.Delay, r.Retention = time.Duration(v.Delay), time.Duration(v.Retention)
	return nil
}

// MarshalJSON encodes r, its Retention as a duration string.
func (r WorkflowRequest) MarshalJSON() ([]byte, error) {
	type plain WorkflowRequest
	return json.Marshal(struct {
		plain
		Retention jsonDuration `json:"retention,omitempty"`
	}{plain(r), jsonDuration(r.Retention)})
}

// UnmarshalJSON decodes r, its Retention from a duration string or a
// number of nanoseconds.
func (r *WorkflowRequest) UnmarshalJSON(b []byte) error {
	type plain WorkflowRequest
	v := struct {
		*plain
		Retention jsonDuration `json:"retention,omitempty"`
	}{plain: (*plain)(r)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	r.Retention = time.Duration(v.Retention)
	return nil
}

// gateJSON is Gate in JSON.
type gateJSON struct {
	Topic   string       `json:"topic"`
	Timeout jsonDuration `json:"timeout"`
}

// MarshalJSON encodes g, its Timeout as a duration string.
func (g Gate) MarshalJSON() ([]byte, error) {
	return json.Marshal(gateJSON{g.Topic, jsonDuration(g.Timeout)})
}

// UnmarshalJSON decodes g, its Timeout from a duration string or a
// number of nanoseconds.
func (g *Gate) UnmarshalJSON(b []byte) error {
	var v gateJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*g = Gate{v.Topic, time.Duration(v.Timeout)}
	return nil
}

// rateLimitJSON is RateLimit in JSON.
type rateLimitJSON struct {
	Name   string       `json:"name"`
	Limit  int64        `json:"limit"`
	Period jsonDuration `json:"period"`
}

// MarshalJSON encodes l, its Period as a duration string.
func (l RateLimit) MarshalJSON() ([]byte, error) {
	return json.Marshal(rateLimitJSON{l.Name, l.Limit, jsonDuration(l.Period)})
}

// UnmarshalJSON decodes l, its Period from a duration string or a number
// of nanoseconds.
func (l *RateLimit) UnmarshalJSON(b []byte) error {
	var v rateLimitJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*l = RateLimit{Name: v.Name, Limit: v.Limit, Period: time.Duration(v.Period)}
	return nil
}

// rateLimitInfoJSON is RateLimitInfo in JSON: RateLimit's fields, then its
// own.
type rateLimitInfoJSON struct {
	rateLimitJSON
	Keys    []RateKeyInfo `json:"keys,omitempty"`
	Waiting int           `json:"waiting"`
}

// MarshalJSON encodes l, its Period as a duration string. (Without it,
// RateLimit's method would encode RateLimit's fields alone.)
func (l RateLimitInfo) MarshalJSON() ([]byte, error) {
	return json.Marshal(rateLimitInfoJSON{rateLimitJSON{l.Name, l.Limit, jsonDuration(l.Period)}, l.Keys, l.Waiting})
}

// UnmarshalJSON decodes l, its Period from a duration string or a number
// of nanoseconds.
func (l *RateLimitInfo) UnmarshalJSON(b []byte) error {
	var v rateLimitInfoJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*l = RateLimitInfo{RateLimit: RateLimit{Name: v.Name, Limit: v.Limit, Period: time.Duration(v.Period)}, Keys: v.Keys, Waiting: v.Waiting}
	return nil
}

// MarshalJSON encodes h, its Bucket as a duration string.
func (h History) MarshalJSON() ([]byte, error) {
	type plain History
	return json.Marshal(struct {
		plain
		Bucket jsonDuration `json:"bucket"`
	}{plain(h), jsonDuration(h.Bucket)})
}

// UnmarshalJSON decodes h, its Bucket from a duration string or a number
// of nanoseconds.
func (h *History) UnmarshalJSON(b []byte) error {
	type plain History
	v := struct {
		*plain
		Bucket jsonDuration `json:"bucket"`
	}{plain: (*plain)(h)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	h.Bucket = time.Duration(v.Bucket)
	return nil
}

// MarshalJSON encodes p, its QueueLag as a duration string.
func (p HistoryPoint) MarshalJSON() ([]byte, error) {
	type plain HistoryPoint
	return json.Marshal(struct {
		plain
		QueueLag jsonDuration `json:"queue_lag"`
	}{plain(p), jsonDuration(p.QueueLag)})
}

// UnmarshalJSON decodes p, its QueueLag from a duration string or a
// number of nanoseconds.
func (p *HistoryPoint) UnmarshalJSON(b []byte) error {
	type plain HistoryPoint
	v := struct {
		*plain
		QueueLag jsonDuration `json:"queue_lag"`
	}{plain: (*plain)(p)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	p.QueueLag = time.Duration(v.QueueLag)
	return nil
}

// MarshalJSON encodes s, its Lease as a duration string.
func (s BehaviorSettings) MarshalJSON() ([]byte, error) {
	type plain BehaviorSettings
	return json.Marshal(struct {
		plain
		Lease jsonDuration `json:"lease,omitempty"`
	}{plain(s), jsonDuration(s.Lease)})
}

// UnmarshalJSON decodes s, its Lease from a duration string or a number of
// nanoseconds.
func (s *BehaviorSettings) UnmarshalJSON(b []byte) error {
	type plain BehaviorSettings
	v := struct {
		*plain
		Lease jsonDuration `json:"lease,omitempty"`
	}{plain: (*plain)(s)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	s.Lease = time.Duration(v.Lease)
	return nil
}

// MarshalJSON encodes c, its OldestAge as a duration string.
func (c DueCount) MarshalJSON() ([]byte, error) {
	type plain DueCount
	return json.Marshal(struct {
		plain
		OldestAge jsonDuration `json:"oldest_age"`
	}{plain(c), jsonDuration(c.OldestAge)})
}

// UnmarshalJSON decodes c, its OldestAge from a duration string or a
// number of nanoseconds.
func (c *DueCount) UnmarshalJSON(b []byte) error {
	type plain DueCount
	v := struct {
		*plain
		OldestAge jsonDuration `json:"oldest_age"`
	}{plain: (*plain)(c)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	c.OldestAge = time.Duration(v.OldestAge)
	return nil
}

// MarshalJSON encodes w with its behavior (Wait.Behavior) in the field
// behavior, beside limit.
func (w Wait) MarshalJSON() ([]byte, error) {
	type plain Wait
	return json.Marshal(struct {
		plain
		Behavior BehaviorID `json:"behavior,omitempty"`
	}{plain(w), w.Behavior()})
}

// UnmarshalJSON decodes w; a wait that names its behavior only in the
// field behavior gets it in Limit too, as Limit holds it in Go.
func (w *Wait) UnmarshalJSON(b []byte) error {
	type plain Wait
	v := struct {
		*plain
		Behavior BehaviorID `json:"behavior,omitempty"`
	}{plain: (*plain)(w)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if w.Limit == "" && v.Behavior != "" {
		w.Limit = string(v.Behavior)
	}
	return nil
}
