package web

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// The states counted per behavior, in the order the dashboard shows them.
var countedStatuses = []api.Status{api.StatusWaiting, api.StatusScheduled, api.StatusRunning, api.StatusHeld, api.StatusSuccess, api.StatusFailure}

// StatsResponse is the answer of GET /api/v1/stats.
type StatsResponse struct {
	// Now is the database's clock at the snapshot.
	Now time.Time `json:"now"`
	// Totals sums the behaviors.
	Totals QueueStats `json:"totals"`
	// Behaviors are the queues, by behavior id: every registered behavior
	// and every behavior that has tasks.
	Behaviors []QueueStats `json:"behaviors"`
	// Nodes count the running tasks per node.
	Nodes []NodeRunning `json:"nodes"`
	// HeldGroups are the group keys on hold.
	HeldGroups []string `json:"held_groups"`
	// QueueLagMS is how long the longest-waiting due task has been due,
	// in milliseconds: the largest OldestDueAgeMS of Behaviors, from the
	// same reading; 0 when no task waits.
	QueueLagMS int64 `json:"queue_lag_ms"`
}

// QueueStats are the numbers of one behavior, or of all.
type QueueStats struct {
	Behavior api.BehaviorID `json:"behavior,omitempty"`
	// Paused is set when an operator paused the behavior.
	Paused bool `json:"paused"`
	// Counts has the number of tasks in each state, zeros included.
	Counts map[api.Status]int64 `json:"counts"`
	Total  int64                `json:"total"`
	// DueNow counts the tasks due and waiting for a worker (not in held
	// groups).
	DueNow int64 `json:"due_now"`
	// OldestDueAgeMS is how long the longest-waiting due task has been
	// due, in milliseconds: the queue lag.
	OldestDueAgeMS int64 `json:"oldest_due_age_ms"`
}

// NodeRunning counts the running tasks of a node.
type NodeRunning struct {
	Node    string `json:"node"`
	Running int64  `json:"running"`
	// ExpiredLeases counts its running tasks whose lease expired: they
	// wait to be taken over.
	ExpiredLeases int64 `json:"expired_leases"`
}

// snapshot is what the statistics endpoints read, cached for StatsMaxAge.
type snapshot struct {
	stats      api.Stats
	settings   []api.BehaviorSettings
	heldGroups []string
	// at is when it was read, on this process's monotonic clock: the
	// database's time now is stats.Now plus time.Since(at).
	at time.Time
}

// snapshot returns the cached statistics, reading them again when they are
// older than StatsMaxAge. Concurrent callers share one read.
func (h *Handler) snapshot(ctx context.Context) (snapshot, error) {
	h.statsMu.Lock()
	defer h.statsMu.Unlock()
	if !h.statsLast.at.IsZero() && time.Since(h.statsLast.at) < h.cfg.StatsMaxAge {
		return h.statsLast, nil
	}
	var s snapshot
	var err error
	if s.stats, err = h.cfg.Client.TaskStats(ctx); err != nil {
		return s, err
	}
	if s.settings, err = h.cfg.Client.Behaviors(ctx); err != nil {
		return s, err
	}
	if s.heldGroups, err = h.cfg.Client.HeldGroups(ctx); err != nil {
		return s, err
	}
	s.at = time.Now()
	h.statsLast = s
	return s, nil
}

// invalidateStats drops the cached statistics after an action that
// changes them, so that the next read shows it.
func (h *Handler) invalidateStats() {
	h.statsMu.Lock()
	h.statsLast = snapshot{}
	h.statsMu.Unlock()
}

func newQueueStats(b api.BehaviorID) *QueueStats {
	q := &QueueStats{Behavior: b, Counts: make(map[api.Status]int64, len(countedStatuses))}
	for _, s := range countedStatuses {
		q.Counts[s] = 0
	}
	return q
}

func (h *Handler) stats(w http.ResponseWriter, r *http.Request) error {
	if _, err := Query(r); err != nil {
		return err
	}
	s, err := h.snapshot(r.Context())
	if err != nil {
		return fmt.Errorf("read stats: %w", err)
	}
	queues := map[api.BehaviorID]*QueueStats{}
	queue := func(b api.BehaviorID) *QueueStats {
		q := queues[b]
		if q == nil {
			q = newQueueStats(b)
			queues[b] = q
		}
		return q
	}
	if h.cfg.Registry != nil {
		for _, b := range h.cfg.Registry.IDs() {
			queue(b)
		}
	}
	for _, b := range s.settings {
		queue(b.Behavior).Paused = b.Paused
	}
	totals := newQueueStats("")
	for _, c := range s.stats.Counts {
		q := queue(c.Behavior)
		q.Counts[c.Status] += c.Count
		q.Total += c.Count
		totals.Counts[c.Status] += c.Count
		totals.Total += c.Count
	}
	for _, d := range s.stats.Due {
		q := queue(d.Behavior)
		q.DueNow = d.Count
		q.OldestDueAgeMS = d.OldestAge.Milliseconds()
		totals.DueNow += d.Count
		totals.OldestDueAgeMS = max(totals.OldestDueAgeMS, q.OldestDueAgeMS)
	}
	resp := StatsResponse{Now: s.stats.Now, Totals: *totals, Behaviors: []QueueStats{}, Nodes: []NodeRunning{}, HeldGroups: s.heldGroups,
		QueueLagMS: totals.OldestDueAgeMS}
	for _, q := range queues {
		resp.Behaviors = append(resp.Behaviors, *q)
	}
	slices.SortFunc(resp.Behaviors, func(a, b QueueStats) int { return cmp.Compare(a.Behavior, b.Behavior) })
	for _, n := range s.stats.Running {
		resp.Nodes = append(resp.Nodes, NodeRunning{Node: n.Node, Running: n.Running, ExpiredLeases: n.Expired})
	}
	if resp.HeldGroups == nil {
		resp.HeldGroups = []string{}
	}
	WriteJSON(w, http.StatusOK, resp)
	return nil
}

// Node health, judged by the age of a node's heartbeat.
const (
	// HealthOK is a node that renewed its heartbeat within 3 intervals.
	HealthOK = "ok"
	// HealthLate is a node that missed 3 heartbeats: busy, or failing.
	HealthLate = "late"
	// HealthDead is a node that missed 10 heartbeats; other nodes drop it
	// from the table at their next maintenance.
	HealthDead = "dead"
)

// NodeStatus is a node as GET /api/v1/nodes shows it.
type NodeStatus struct {
	api.Node
	// HeartbeatAgeMS is how long ago, by the database's clock, the node
	// renewed its heartbeat.
	HeartbeatAgeMS int64 `json:"heartbeat_age_ms"`
	// Health is ok, late or dead.
	Health string `json:"health"`
	// Running counts the tasks it holds a lease on.
	Running int64 `json:"running"`
	// ExpiredLeases counts its running tasks whose lease expired.
	ExpiredLeases int64 `json:"expired_leases"`
}

// NodesResponse is the answer of GET /api/v1/nodes.
type NodesResponse struct {
	Nodes []NodeStatus `json:"nodes"`
}

func (h *Handler) nodes(w http.ResponseWriter, r *http.Request) error {
	if _, err := Query(r); err != nil {
		return err
	}
	s, err := h.snapshot(r.Context())
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	nodes, err := h.cfg.Client.Nodes(r.Context())
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	dbNow := s.stats.Now.Add(time.Since(s.at))
	hb := h.cfg.NodeHeartbeat
	resp := NodesResponse{Nodes: make([]NodeStatus, 0, len(nodes))}
	for _, n := range nodes {
		if n.Behaviors == nil {
			n.Behaviors = []api.BehaviorID{}
		}
		age := max(dbNow.Sub(n.HeartbeatAt), 0)
		ns := NodeStatus{Node: n, HeartbeatAgeMS: age.Milliseconds(), Health: HealthOK}
		switch {
		case age > 10*hb:
			ns.Health = HealthDead
		case age > 3*hb:
			ns.Health = HealthLate
		}
		for _, nr := range s.stats.Running {
			if nr.Node == n.ID {
				ns.Running, ns.ExpiredLeases = nr.Running, nr.Expired
			}
		}
		resp.Nodes = append(resp.Nodes, ns)
	}
	WriteJSON(w, http.StatusOK, resp)
	return nil
}

// groupAction returns the handler of POST /groups/{key}/hold or release.
func (h *Handler) groupAction(hold bool) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		key := r.PathValue("key")
		do, verb := h.cfg.Client.ReleaseGroup, "release"
		if hold {
			do, verb = h.cfg.Client.HoldGroup, "hold"
		}
		if err := do(r.Context(), key); err != nil {
			return fmt.Errorf("%s group %q: %w", verb, key, err)
		}
		h.invalidateStats()
		WriteJSON(w, http.StatusOK, map[string]any{"group_key": key, "held": hold})
		return nil
	}
}

// behaviorAction returns the handler of POST /behaviors/{id}/pause or
// resume.
func (h *Handler) behaviorAction(pause bool) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		id := api.BehaviorID(r.PathValue("id"))
		if err := spi.CheckBehaviorID(id); err != nil {
			return err
		}
		do, verb := h.cfg.Client.Resume, "resume"
		if pause {
			do, verb = h.cfg.Client.Pause, "pause"
		}
		err := do(r.Context(), id)
		if errors.Is(err, api.ErrUnknownBehavior) {
			return notFound("behavior %s is not registered", id)
		}
		if err != nil {
			return fmt.Errorf("%s behavior %s: %w", verb, id, err)
		}
		h.invalidateStats()
		WriteJSON(w, http.StatusOK, map[string]any{"behavior": id, "paused": pause})
		return nil
	}
}

// SchedulesResponse is the answer of GET /api/v1/schedules.
type SchedulesResponse struct {
	Schedules []api.ScheduleInfo `json:"schedules"`
}

func (h *Handler) schedules(w http.ResponseWriter, r *http.Request) error {
	if _, err := Query(r); err != nil {
		return err
	}
	list, err := h.cfg.Client.Schedules(r.Context())
	if err != nil {
		return fmt.Errorf("list schedules: %w", err)
	}
	if list == nil {
		list = []api.ScheduleInfo{}
	}
	for i := range list {
		h.cfg.Registry.RedactSchedule(&list[i].Schedule) // no password is ever shown
	}
	WriteJSON(w, http.StatusOK, SchedulesResponse{Schedules: list})
	return nil
}
