package postgres

// The local start of woken workflow nodes: what a finish offers
// depsEndedSQL (starts) and what it reads back of the tasks it started.

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// starts is a finish's local start (store.LocalStart): its behaviors as
// statement parameters, the room it reserved, asked for once, and the
// tasks it started.
type starts struct {
	store.LocalStart
	behaviors []string
	leases    []int64
	asked     bool
	limit     int
	started   []store.Claimed
	handed    bool // the claims of HandOver were made (see finishHandOver)
}

// newStarts returns the starts of l.
func newStarts(l store.LocalStart) *starts {
	st := &starts{LocalStart: l}
	st.behaviors, st.leases = behaviorLeases(l.Behaviors)
	return st
}

// room returns how many more tasks may start, asking Reserve the first
// time.
func (st *starts) room() int {
	if !st.asked && st.Reserve != nil {
		st.asked, st.limit = true, st.Reserve()
	}
	return st.limit - len(st.started)
}

// appendStarted appends to started the tasks depsEndedSQL started, given
// as its JSON.
func appendStarted(started []store.Claimed, raw []byte) ([]store.Claimed, error) {
	var rows []struct {
		ID          string          `json:"id"`
		Lease       pgtype.UUID     `json:"lease"`
		LeaseUS     int64           `json:"lease_us"`
		Behavior    string          `json:"behavior"`
		Params      json.RawMessage `json:"params"`
		Progress    json.RawMessage `json:"progress"`
		Attempt     int             `json:"attempt"`
		Errors      int             `json:"errors"`
		Priority    int             `json:"priority"`
		Parent      *string         `json:"parent"`
		GroupKey    *string         `json:"group_key"`
		Trace       *string         `json:"trace"`
		Resubmitted bool            `json:"resubmitted"`
		Version     *int            `json:"version"`
	}
	if err := json.Unmarshal(raw, &rows); err != nil {
		return nil, fmt.Errorf("read started tasks: %w", err)
	}
	deref := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	for _, r := range rows {
		params, progress := r.Params, r.Progress
		if len(params) == 0 || string(params) == "null" {
			params = json.RawMessage("{}")
		}
		if string(progress) == "null" {
			progress = nil
		}
		started = append(started, store.Claimed{
			LeaseRef:      store.LeaseRef{ID: api.TaskID(r.ID), Lease: r.Lease.Bytes},
			LeaseDuration: time.Duration(r.LeaseUS) * time.Microsecond,
			Behavior:      api.BehaviorID(r.Behavior),
			Params:        params,
			Progress:      progress,
			Attempt:       r.Attempt,
			Errors:        r.Errors,
			Priority:      r.Priority,
			ParentID:      api.TaskID(deref(r.Parent)),
			GroupKey:      deref(r.GroupKey),
			Trace:         deref(r.Trace),
			Resubmitted:   r.Resubmitted,
		})
		if r.Version != nil {
			started[len(started)-1].Version = *r.Version
		}
	}
	return started, nil
}
