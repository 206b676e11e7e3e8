package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// IdempotencyKeyHeader is the header of a signal's idempotency key
// (api.SignalKey), which the query parameter key may give instead.
const IdempotencyKeyHeader = "Idempotency-Key"

// SignalResponse is the answer of POST /api/v1/tasks/{id}/signals/{topic}
// and of POST /api/v1/workflows/{id}/nodes/{name}/signals/{topic}: the
// signal is stored, durable, or its key was seen and nothing was stored.
type SignalResponse struct {
	// ID is the task signalled; for a workflow's node, the node's task.
	ID    api.TaskID `json:"id"`
	Topic string     `json:"topic"`
	// Key is the idempotency key; empty when none was sent.
	Key string `json:"key,omitempty"`
}

// signalRequest is a signal as its request gives it.
type signalRequest struct {
	topic   string
	payload json.RawMessage
	key     string
}

// readSignal reads the signal of a request: its topic from the path, its
// key from the header Idempotency-Key or the query parameter key (the two
// must agree when both are sent), and its payload from the body, at most
// api.MaxSignalBytes of JSON (no body is the payload null). The topic and
// the key are checked where the signal is sent.
func readSignal(w http.ResponseWriter, r *http.Request) (signalRequest, error) {
	q, err := Query(r, "key")
	if err != nil {
		return signalRequest{}, err
	}
	s := signalRequest{topic: r.PathValue("topic"), key: q.Get("key")}
	header, inHeader := r.Header[IdempotencyKeyHeader]
	switch {
	case len(header) > 1:
		return signalRequest{}, invalid("key", "the header %s is given %d times", IdempotencyKeyHeader, len(header))
	case inHeader && q.Has("key") && header[0] != s.key:
		return signalRequest{}, invalid("key", "the header %s (%q) and the query parameter key (%q) differ", IdempotencyKeyHeader, header[0], s.key)
	case inHeader:
		s.key = header[0]
	}
	if (inHeader || q.Has("key")) && s.key == "" {
		return signalRequest{}, invalid("key", "empty; leave it out for a signal without one")
	}
	raw, err := readBody(w, r, api.MaxSignalBytes)
	if err != nil {
		return signalRequest{}, err
	}
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := decodeJSON(raw, &s.payload); err != nil {
			return signalRequest{}, err
		}
	}
	return s, nil
}

// send sends s to task id and answers 202.
func (h *Handler) send(w http.ResponseWriter, r *http.Request, id api.TaskID, s signalRequest) error {
	var opts []api.SignalOption
	if s.key != "" {
		opts = append(opts, api.SignalKey(s.key))
	}
	if err := h.cfg.Client.Signal(r.Context(), id, s.topic, s.payload, opts...); err != nil {
		return TaskError(id, "signal", err)
	}
	WriteJSON(w, http.StatusAccepted, SignalResponse{ID: id, Topic: s.topic, Key: s.key})
	return nil
}

// signalTask serves POST /tasks/{id}/signals/{topic}.
func (h *Handler) signalTask(w http.ResponseWriter, r *http.Request) error {
	s, err := readSignal(w, r)
	if err != nil {
		return err
	}
	return h.send(w, r, api.TaskID(r.PathValue("id")), s)
}

// signalNode serves POST /workflows/{id}/nodes/{name}/signals/{topic}.
func (h *Handler) signalNode(w http.ResponseWriter, r *http.Request) error {
	s, err := readSignal(w, r)
	if err != nil {
		return err
	}
	id, err := NodeTaskID(r.Context(), h.cfg.Client, api.TaskID(r.PathValue("id")), r.PathValue("name"))
	if err != nil {
		return err
	}
	return h.send(w, r, id, s)
}

// NodeTaskID returns the task id of the node name of the workflow wf,
// read on the primary: a 404 *Error that says which is missing when wf is
// no workflow or has no node of the name.
func NodeTaskID(ctx context.Context, c api.Operator, wf api.TaskID, name string) (api.TaskID, error) {
	ctx = store.ReadPrimary(ctx)
	t, err := c.Get(ctx, wf)
	switch {
	case errors.Is(err, api.ErrNotFound) || (err == nil && t.Behavior != api.WorkflowBehavior):
		return "", notFound("workflow %s not found", wf)
	case err != nil:
		return "", fmt.Errorf("get workflow %s: %w", wf, err)
	}
	id := wf + "/" + api.TaskID(name)
	n, err := c.Get(ctx, id)
	switch {
	case errors.Is(err, api.ErrNotFound) || (err == nil && n.ParentID != wf):
		return "", notFound("workflow %s has no node %q", wf, name)
	case err != nil:
		return "", fmt.Errorf("get node %q of workflow %s: %w", name, wf, err)
	}
	return id, nil
}
