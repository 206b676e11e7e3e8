package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/timefmt"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// Query reads the parameters of a request's query string for a handler:
// each may be given once, and names outside the allowed ones are a 400, so
// that a misspelt filter is not silently ignored.
func Query(r *http.Request, allowed ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, invalid("query", "%v", err)
	}
	for name, vs := range q {
		known := false
		for _, a := range allowed {
			known = known || a == name
		}
		if !known {
			return nil, invalid(name, "unknown query parameter; known: %v", allowed)
		}
		if len(vs) > 1 {
			return nil, invalid(name, "given %d times", len(vs))
		}
	}
	return q, nil
}

// limitFromQuery reads the page size of a list: 0 when absent, else 1 to
// 1000.
func limitFromQuery(q url.Values) (int, error) {
	s := q.Get("limit")
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 1000 {
		return 0, invalid("limit", "%q is not a number from 1 to 1000", s)
	}
	return n, nil
}

// filterFromQuery reads the task filters of a list or event stream.
func filterFromQuery(q url.Values) (api.Filter, error) {
	f := api.Filter{
		ID:       api.TaskID(q.Get("id")),
		Behavior: api.BehaviorID(q.Get("behavior")),
		Status:   api.Status(q.Get("status")),
		ParentID: api.TaskID(q.Get("parent")),
		GroupKey: q.Get("group"),
		After:    api.TaskID(q.Get("after")),
	}
	if f.ID != "" {
		if err := spi.CheckTaskID("id", f.ID); err != nil {
			return f, err
		}
	}
	if f.Behavior != "" {
		if err := spi.CheckBehaviorID(f.Behavior); err != nil {
			return f, err
		}
	}
	if f.ParentID != "" {
		if err := spi.CheckTaskID("parent", f.ParentID); err != nil {
			return f, err
		}
	}
	if f.After != "" {
		if err := spi.CheckTaskID("after", f.After); err != nil {
			return f, err
		}
	}
	if q.Has("group") {
		if err := spi.CheckGroupKey("group", f.GroupKey); err != nil {
			return f, err
		}
	}
	var err error
	f.Limit, err = limitFromQuery(q)
	if err != nil {
		return f, err
	}
	return f, nil
}

func (h *Handler) listTasks(w http.ResponseWriter, r *http.Request) error {
	q, err := Query(r, "behavior", "status", "parent", "group", "after", "limit", "fields")
	if err != nil {
		return err
	}
	f, err := filterFromQuery(q)
	if err != nil {
		return err
	}
	// A list leaves out the tasks' params, result and progress unless
	// asked: a page of big tasks would carry them all.
	switch q.Get("fields") {
	case "":
		f.Brief = true
	case "payloads":
	default:
		return invalid("fields", "%q is not a set of fields: payloads (params, result and progress) or none", q.Get("fields"))
	}
	page, err := h.cfg.Client.List(r.Context(), f)
	if err != nil {
		return fmt.Errorf("list tasks: %w", err)
	}
	h.cfg.Registry.RedactTasks(page.Tasks) // no password is ever shown
	WriteJSON(w, http.StatusOK, page)
	return nil
}

// MaxWait bounds the wait of GET /api/v1/tasks/{id}?wait=D.
const MaxWait = time.Minute

// WaitHeader is the response header that says how a GET
// /api/v1/tasks/{id}?wait=D ended: WaitFinished or WaitTimeout.
const WaitHeader = "Stint-Wait"

// The values of WaitHeader.
const (
	// WaitFinished says the task is finished for good (api.Task.Finished):
	// it succeeded, or failed with no retry left.
	WaitFinished = "finished"
	// WaitTimeout says the wait ran out first; the answer is the task's
	// state at that moment.
	WaitTimeout = "timeout"
)

func (h *Handler) getTask(w http.ResponseWriter, r *http.Request) error {
	q, err := Query(r, "wait")
	if err != nil {
		return err
	}
	id := api.TaskID(r.PathValue("id"))
	var t api.Task
	if q.Has("wait") {
		wait, err := parseWait(q.Get("wait"))
		if err != nil {
			return err
		}
		if t, err = h.awaitTask(w, r, id, wait); err != nil {
			return err
		}
		outcome := WaitTimeout
		if t.Finished() {
			outcome = WaitFinished
		}
		w.Header().Set(WaitHeader, outcome)
	} else if t, err = h.cfg.Client.Get(r.Context(), id); err != nil {
		return TaskError(id, "get", err)
	}
	h.cfg.Registry.RedactTask(&t) // no password is ever shown
	WriteJSON(w, http.StatusOK, t)
	return nil
}

// parseWait reads the query parameter wait: a Go duration above zero and
// at most MaxWait.
func parseWait(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, invalid("wait", "%q is not a duration such as \"30s\"", s)
	}
	if d <= 0 || d > MaxWait {
		return 0, invalid("wait", "%s is out of range: more than 0 and at most %s", s, timefmt.Duration(MaxWait))
	}
	return d, nil
}

// longPoll readies w for an answer that may come wait from now, past the
// server's read and write timeouts: it lifts the read deadline (a client
// that goes away still ends the request's context, and with it the wait)
// and moves the write deadline past the wait.
func longPoll(w http.ResponseWriter, wait time.Duration) error {
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	if err := rc.SetWriteDeadline(time.Now().Add(wait + WriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

// awaitTask waits up to wait for task id to finish for good (see
// longPoll), and returns its state then, finished or not.
func (h *Handler) awaitTask(w http.ResponseWriter, r *http.Request, id api.TaskID, wait time.Duration) (api.Task, error) {
	if err := longPoll(w, wait); err != nil {
		return api.Task{}, fmt.Errorf("await task %s: %w", id, err)
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	t, err := h.cfg.Client.Await(ctx, id)
	if err == nil {
		return t, nil
	}
	if r.Context().Err() != nil || ctx.Err() == nil {
		return api.Task{}, TaskError(id, "await", err)
	}
	// The wait ran out: answer with the task as it is now.
	if t, err = h.cfg.Client.Get(r.Context(), id); err != nil {
		return api.Task{}, TaskError(id, "get", err)
	}
	return t, nil
}

// TaskError wraps the error of an action on task id for a handler to
// return: a 404 names the task, invalid input and conflicts pass as they
// are (their messages name it), anything else gets the verb and the id.
// Routes of other packages use it as the API's own do.
func TaskError(id api.TaskID, verb string, err error) error {
	return actionError("task", id, verb, err)
}

// workflowError is TaskError for an action on the workflow id.
func workflowError(id api.TaskID, verb string, err error) error {
	return actionError("workflow", id, verb, err)
}

// actionError wraps the error of an action on the task or workflow (what)
// id, as TaskError says.
func actionError(what string, id api.TaskID, verb string, err error) error {
	switch errorFor(err).Code {
	case CodeNotFound:
		return notFound("%s %s not found", what, id)
	case CodeInvalid, CodeConflict:
		return err // the message names it already
	}
	return fmt.Errorf("%s %s %s: %w", verb, what, id, err)
}

// SubmitBody is the body of POST /api/v1/tasks.
type SubmitBody struct {
	// Behavior is the behavior to run. Required.
	Behavior api.BehaviorID `json:"behavior"`
	// Params are the behavior's params; absent means {}.
	Params json.RawMessage `json:"params,omitempty"`
	// ID overrides the id the behavior derives.
	ID api.TaskID `json:"id,omitempty"`
	// Priority overrides the behavior's default; lower runs first.
	Priority *int `json:"priority,omitempty"`
	// Delay postpones the first run, as a Go duration such as "90s".
	Delay string `json:"delay,omitempty"`
	// Retention keeps the task this long after it finished for good, as a
	// Go duration such as "24h"; absent means its behavior's retention.
	Retention string `json:"retention,omitempty"`
	// GroupKey scopes holds and limits.
	GroupKey string `json:"group_key,omitempty"`
	// Debounce debounces the submit with the other debounced submits of
	// its id (api.Debounce); absent submits as usual.
	Debounce *DebounceBody `json:"debounce,omitempty"`
}

// DebounceBody is api.Debounce in a submit's body, its durations as Go
// duration strings such as "5s".
type DebounceBody struct {
	// Window is how long the task waits after the last submit.
	Window string `json:"window"`
	// MaxWait bounds how long a cycle of submits postpones the task.
	MaxWait string `json:"max_wait"`
}

// request returns the submit request of b; field prefixes the names of
// the fields its errors name.
func (b SubmitBody) request(field string) (api.SubmitRequest, error) {
	req := api.SubmitRequest{Behavior: b.Behavior, Params: b.Params, ID: b.ID, Priority: b.Priority, GroupKey: b.GroupKey}
	if b.Delay != "" {
		d, err := time.ParseDuration(b.Delay)
		if err != nil {
			return req, invalid(field+"delay", "%q is not a duration such as \"90s\" or \"1h30m\"", b.Delay)
		}
		req.Delay = d
	}
	if b.Retention != "" {
		d, err := time.ParseDuration(b.Retention)
		if err != nil {
			return req, invalid(field+"retention", "%q is not a duration such as \"24h\"", b.Retention)
		}
		req.Retention = d
	}
	if b.Debounce != nil {
		req.Debounce = &api.Debounce{}
		for _, d := range []struct {
			name, text string
			to         *time.Duration
		}{{"window", b.Debounce.Window, &req.Debounce.Window}, {"max_wait", b.Debounce.MaxWait, &req.Debounce.MaxWait}} {
			v, err := time.ParseDuration(d.text)
			if err != nil {
				return req, invalid(field+"debounce."+d.name, "%q is not a duration such as \"5s\" or \"1m\"", d.text)
			}
			*d.to = v
		}
	}
	return req, nil
}

// MaxBatchSubmit caps the tasks of one batch submit (POST /api/v1/tasks
// with an array).
const MaxBatchSubmit = 1000

// SubmitAnswer is the answer for one element of a batch submit: its
// submission, or its own error.
type SubmitAnswer struct {
	// Submission is what the submit did; nil when it failed.
	*api.Submission
	// Error is why this element was not stored; nil when it was.
	Error *Error `json:"error,omitempty"`
}

// submitTask submits one task (a JSON object) or a batch (a JSON array of
// them).
func (h *Handler) submitTask(w http.ResponseWriter, r *http.Request) error {
	if _, err := Query(r); err != nil {
		return err
	}
	raw, err := readBody(w, r, MaxBody)
	if err != nil {
		return err
	}
	if trimmed := bytes.TrimLeft(raw, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '[' {
		return h.submitBatch(w, r, raw)
	}
	var body SubmitBody
	if err := decodeJSON(raw, &body); err != nil {
		return err
	}
	req, err := body.request("")
	if err != nil {
		return err
	}
	sub, err := h.cfg.Client.Submit(r.Context(), req)
	if err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	status := http.StatusOK
	if sub.Created {
		status = http.StatusCreated
	}
	w.Header().Set("Location", apiPrefix+"/tasks/"+url.PathEscape(string(sub.ID)))
	WriteJSON(w, status, sub)
	return nil
}

// submitBatch submits the elements of a JSON array each on its own and
// answers 200 with one SubmitAnswer per element, in order: an element
// refused (bad JSON of its own, bad params, refused by the database) gets
// its error and the others are stored all the same. The submits run
// concurrently, so that they share statements (see impl.Client.Submit);
// two elements of one id are merged in no stated order.
func (h *Handler) submitBatch(w http.ResponseWriter, r *http.Request, raw []byte) error {
	var elems []json.RawMessage
	if err := decodeJSON(raw, &elems); err != nil {
		return err
	}
	switch {
	case len(elems) == 0:
		return invalid("body", "an empty array; give at least one task")
	case len(elems) > MaxBatchSubmit:
		return invalid("body", "%d tasks; at most %d per request", len(elems), MaxBatchSubmit)
	}
	answers := make([]SubmitAnswer, len(elems))
	var wg sync.WaitGroup
	for i, elem := range elems {
		var body SubmitBody
		if err := decodeJSON(elem, &body); err != nil {
			answers[i].Error = errorFor(err)
			continue
		}
		req, err := body.request("")
		if err != nil {
			answers[i].Error = errorFor(err)
			continue
		}
		wg.Go(func() {
			sub, err := h.cfg.Client.Submit(r.Context(), req)
			if err != nil {
				answers[i].Error = errorFor(err)
				if answers[i].Error.Status >= 500 && !errors.Is(err, api.ErrUnavailable) && r.Context().Err() == nil {
					h.log.Error("stint http: batch submit: element failed", "element", i, "err", err)
				}
				return
			}
			answers[i].Submission = &sub
		})
	}
	wg.Wait()
	if err := r.Context().Err(); err != nil {
		return fmt.Errorf("batch submit: %w", err) // the client went away
	}
	WriteJSON(w, http.StatusOK, answers)
	return nil
}

func (h *Handler) removeTask(w http.ResponseWriter, r *http.Request) error {
	id := api.TaskID(r.PathValue("id"))
	if err := h.cfg.Client.Remove(r.Context(), id); err != nil {
		return TaskError(id, "remove", err)
	}
	h.invalidateStats()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// taskAction returns the handler of an admin action on one task; it
// answers with the task's state after the action.
func (h *Handler) taskAction(verb string, do func(context.Context, api.TaskID) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		id := api.TaskID(r.PathValue("id"))
		if err := do(r.Context(), id); err != nil {
			return TaskError(id, verb, err)
		}
		h.invalidateStats()
		// Read back on the primary: a standby may not show the action yet.
		t, err := h.cfg.Client.Get(store.ReadPrimary(r.Context()), id)
		if err != nil {
			return TaskError(id, "get", err)
		}
		h.cfg.Registry.RedactTask(&t) // the dashboard shows this answer
		WriteJSON(w, http.StatusOK, t)
		return nil
	}
}

// FailBody is the body of POST /api/v1/tasks/{id}/fail.
type FailBody struct {
	// Reason says why the task is failed; it is stored in its error.
	// Required.
	Reason string `json:"reason"`
}

// failTask fails a waiting task by hand and answers with its state after.
func (h *Handler) failTask(w http.ResponseWriter, r *http.Request) error {
	if _, err := Query(r); err != nil {
		return err
	}
	var body FailBody
	if err := decodeBody(w, r, &body); err != nil {
		return err
	}
	return h.taskAction("fail", func(ctx context.Context, id api.TaskID) error {
		return h.cfg.Client.Fail(ctx, id, body.Reason)
	})(w, r)
}
