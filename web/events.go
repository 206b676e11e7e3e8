package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stinthq/stint/api"
)

// feedBatch is how many changes an event stream with a cursor reads at a
// time.
const feedBatch = 1000

// streamWriteTimeout bounds each write to an event stream: a client that
// stops reading is dropped after it.
const streamWriteTimeout = 30 * time.Second

// ReadyEvent is the data of the "ready" event that starts every event
// stream: after it, every change that commits is sent.
type ReadyEvent struct {
	// Cursor is where a stream with a cursor starts; zero for a stream
	// without one.
	Cursor int64 `json:"cursor,omitempty"`
}

// CursorEvent is the data of a "cursor" event: the events before it are
// those up to Cursor. Its SSE id is the cursor too.
type CursorEvent struct {
	Cursor int64 `json:"cursor"`
}

// ChangesResponse is the answer of GET /api/v1/changes.
type ChangesResponse struct {
	// Changes are the latest changes of tasks, newest first.
	Changes []api.Event `json:"changes"`
}

// recentChanges serves the latest changes, which the dashboard shows
// before the event stream brings new ones.
func (h *Handler) recentChanges(w http.ResponseWriter, r *http.Request) error {
	q, err := Query(r, "limit")
	if err != nil {
		return err
	}
	limit := 50
	if s := q.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > 1000 {
			return invalid("limit", "%q is not a number from 1 to 1000", s)
		}
	}
	changes, err := h.cfg.Client.RecentChanges(r.Context(), limit)
	if err != nil {
		return fmt.Errorf("read recent changes: %w", err)
	}
	if changes == nil {
		changes = []api.Event{}
	}
	WriteJSON(w, http.StatusOK, ChangesResponse{Changes: changes})
	return nil
}

func (h *Handler) events(w http.ResponseWriter, r *http.Request) error {
	q, err := Query(r, "id", "behavior", "status", "parent", "since")
	if err != nil {
		return err
	}
	f, err := filterFromQuery(q)
	if err != nil {
		return err
	}
	if f.Status != "" && !f.Status.Valid() && f.Status != api.StatusRemoved {
		return invalid("status", "%q is not a task status", f.Status)
	}
	since := q.Get("since")
	if since == "" {
		since = strings.TrimSpace(r.Header.Get("Last-Event-ID"))
	}
	if n := h.streams.Add(1); n > int64(h.cfg.MaxStreams) {
		h.streams.Add(-1)
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable,
			Message: fmt.Sprintf("too many event streams open (the limit is %d); retry later", h.cfg.MaxStreams)}
	}
	defer h.streams.Add(-1)
	if since != "" {
		return h.feedStream(w, r, f, since)
	}
	return h.subscribeStream(w, r, f)
}

// subscribeStream streams the changes of tasks matching f from now on,
// through Client.Subscribe. A stream of one task ends after the task
// finishes or is removed, with an "end" event.
func (h *Handler) subscribeStream(w http.ResponseWriter, r *http.Request, f api.Filter) error {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ch, err := h.cfg.Client.Subscribe(ctx, f)
	if err != nil {
		if f.ID != "" {
			return TaskError(f.ID, "subscribe to", err)
		}
		return fmt.Errorf("subscribe: %w", err)
	}
	s := newStream(w)
	if err := s.start(ReadyEvent{}); err != nil {
		return nil
	}
	keepAlive := time.NewTicker(h.cfg.StreamKeepAlive)
	defer keepAlive.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-ch:
			if !ok {
				_ = s.send("end", "", struct{}{})
				return nil
			}
			if err := s.send("task", "", e); err != nil {
				return nil
			}
		case <-keepAlive.C:
			if err := s.comment("keep-alive"); err != nil {
				return nil
			}
		}
	}
}

// feedStream streams the changes of tasks matching f after the cursor
// since ("now": from now on), reading the change feed, with a "cursor"
// event after each batch.
func (h *Handler) feedStream(w http.ResponseWriter, r *http.Request, f api.Filter, since string) error {
	ctx := r.Context()
	var cursor int64
	if since == "now" {
		head, err := h.cfg.Client.FeedHead(ctx)
		if err != nil {
			return fmt.Errorf("read the feed head: %w", err)
		}
		cursor = head
	} else {
		n, err := strconv.ParseInt(since, 10, 64)
		if err != nil || n < 0 {
			return invalid("since", "%q is not a cursor (a number from a stream's cursor event) or \"now\"", since)
		}
		cursor = n
	}
	filter := api.ChangeFilter{Since: cursor, Limit: feedBatch, TaskID: f.ID, Behavior: f.Behavior, ParentID: f.ParentID, Status: f.Status}
	// The first read comes before the response starts, so that a cursor
	// the feed no longer holds is a 400.
	events, next, err := h.cfg.Client.ReadFeed(ctx, filter)
	if err != nil {
		return fmt.Errorf("read changes: %w", err)
	}
	s := newStream(w)
	if err := s.start(ReadyEvent{Cursor: cursor}); err != nil {
		return nil
	}
	poll := time.NewTicker(h.cfg.FeedPoll)
	defer poll.Stop()
	lastSent := time.Now()
	for {
		for _, e := range events {
			if err := s.send("task", "", e); err != nil {
				return nil
			}
		}
		// Send the cursor after events, and now and then without: it
		// keeps the connection alive and the client's cursor fresh.
		if next != cursor && (len(events) > 0 || time.Since(lastSent) >= h.cfg.StreamKeepAlive) {
			if err := s.send("cursor", strconv.FormatInt(next, 10), CursorEvent{Cursor: next}); err != nil {
				return nil
			}
			lastSent = time.Now()
		}
		cursor = next
		if len(events) < feedBatch {
			select {
			case <-ctx.Done():
				return nil
			case <-poll.C:
			}
		}
		filter.Since = cursor
		events, next, err = h.cfg.Client.ReadFeed(ctx, filter)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, api.ErrInvalid):
			// The cursor expired while the client lagged: say so and end.
			_ = s.send("error", "", errorBody{errorFor(err)})
			return nil
		case err != nil:
			h.log.Warn("stint http: event stream: read changes failed; retrying", "err", err)
			events, next = nil, cursor
		}
	}
}

// stream writes Server-Sent Events.
type stream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newStream(w http.ResponseWriter) *stream {
	return &stream{w: w, rc: http.NewResponseController(w)}
}

// start writes the response header and the "ready" event. It lifts the
// server's read deadline: the request has been read, and a read timeout
// would end the stream; a client that went away shows as a failed write.
func (s *stream) start(ready ReadyEvent) error {
	if err := s.rc.SetReadDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("event stream: %w", err)
	}
	hd := s.w.Header()
	hd.Set("Content-Type", "text/event-stream; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no") // no buffering in nginx-like proxies
	s.w.WriteHeader(http.StatusOK)
	return s.send("ready", "", ready)
}

// send writes one event with its JSON data, and an id unless id is empty.
func (s *stream) send(event, id string, data any) error {
	raw, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("encode %s event: %w", event, err)
	}
	var b strings.Builder
	b.WriteString("event: ")
	b.WriteString(event)
	b.WriteByte('\n')
	if id != "" {
		b.WriteString("id: ")
		b.WriteString(id)
		b.WriteByte('\n')
	}
	b.WriteString("data: ")
	b.Write(raw)
	b.WriteString("\n\n")
	return s.write(b.String())
}

// comment writes an SSE comment, which clients ignore.
func (s *stream) comment(text string) error { return s.write(": " + text + "\n\n") }

func (s *stream) write(text string) error {
	if err := s.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("event stream: %w", err)
	}
	if _, err := s.w.Write([]byte(text)); err != nil {
		return fmt.Errorf("event stream: %w", err)
	}
	if err := s.rc.Flush(); err != nil {
		return fmt.Errorf("event stream: %w", err)
	}
	return nil
}
