package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/stinthq/stint/api"
)

// EventsResponse is the answer of GET /api/v1/tasks/{id}/events: the
// events of a task, in key order.
type EventsResponse struct {
	Events []api.TaskEvent `json:"events"`
}

// The values of the WaitHeader of GET /api/v1/tasks/{id}/events?wait=D
// besides WaitFinished (the task finished without the event) and
// WaitTimeout.
const (
	// WaitSet says the event was set.
	WaitSet = "set"
)

// taskEvents serves GET /tasks/{id}/events: every event of the task, or
// with key=K the one of that key (none when it is not set). With wait=D
// (and a key) it answers once the event is set, or when the task finished
// without it, or when D (at most MaxWait) ran out: the header Stint-Wait
// says which.
func (h *Handler) taskEvents(w http.ResponseWriter, r *http.Request) error {
	q, err := Query(r, "key", "wait")
	if err != nil {
		return err
	}
	id := api.TaskID(r.PathValue("id"))
	key := q.Get("key")
	if !q.Has("wait") {
		resp := EventsResponse{Events: []api.TaskEvent{}}
		if key == "" {
			t, err := h.cfg.Client.Get(r.Context(), id)
			if err != nil {
				return TaskError(id, "get events of", err)
			}
			resp.Events = append(resp.Events, t.Events...)
		} else if e, err := h.cfg.Client.GetEvent(r.Context(), id, key); err == nil {
			resp.Events = append(resp.Events, e)
		} else if !errors.Is(err, api.ErrNotFound) {
			return TaskError(id, "get events of", err)
		} else if _, err := h.cfg.Client.Get(r.Context(), id); err != nil {
			return TaskError(id, "get events of", err) // no such task
		}
		WriteJSON(w, http.StatusOK, resp)
		return nil
	}
	if key == "" {
		return invalid("key", "a wait needs the key of the event to wait for")
	}
	wait, err := parseWait(q.Get("wait"))
	if err != nil {
		return err
	}
	if err := longPoll(w, wait); err != nil {
		return fmt.Errorf("await event of task %s: %w", id, err)
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	e, err := h.cfg.Client.AwaitEvent(ctx, id, key)
	resp, outcome := EventsResponse{Events: []api.TaskEvent{}}, WaitSet
	switch {
	case err == nil:
		resp.Events = append(resp.Events, e)
	case r.Context().Err() == nil && ctx.Err() != nil:
		outcome = WaitTimeout
	case errors.Is(err, api.ErrNotFound):
		// No such task, or it finished without the event.
		if _, gerr := h.cfg.Client.Get(r.Context(), id); gerr != nil {
			return TaskError(id, "await event of", gerr)
		}
		outcome = WaitFinished
	default:
		return TaskError(id, "await event of", err)
	}
	w.Header().Set(WaitHeader, outcome)
	WriteJSON(w, http.StatusOK, resp)
	return nil
}
