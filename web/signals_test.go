package web_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/web"
)

// signals returns the signals of task id that no run consumed, as GET
// /api/v1/tasks/{id} lists them.
func (e *testEnv) signals(id api.TaskID) []api.Signal {
	e.t.Helper()
	var task api.Task
	e.json(http.MethodGet, "/api/v1/tasks/"+string(id), readToken, nil, http.StatusOK, &task)
	return task.Signals
}

// TestSignalsOverHTTP: POST /tasks/{id}/signals/{topic} stores a message
// with its payload (none is null) and its idempotency key, from the header
// or the query; a key seen stores nothing; bad input of every kind is
// refused and stores nothing; ids and topics with slashes are read whole.
func TestSignalsOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.submit(web.SubmitBody{Behavior: idleKind.ID, ID: "orders/1"}) // never runs
	base := "/api/v1/tasks/" + string(id) + "/signals/"

	var sent web.SignalResponse
	e.json(http.MethodPost, base+"bank/paid", submitToken, map[string]any{"amount": 12}, http.StatusAccepted, &sent)
	require.Equal(t, web.SignalResponse{ID: id, Topic: "bank/paid"}, sent)
	r := e.doWith(http.MethodPost, base+"approval", submitToken, http.Header{web.IdempotencyKeyHeader: {"hook-1"}}, nil)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	require.NoError(t, json.Unmarshal(r.body, &sent))
	require.Equal(t, web.SignalResponse{ID: id, Topic: "approval", Key: "hook-1"}, sent)
	// The key again, from the query this time: nothing more is stored.
	e.json(http.MethodPost, base+"approval?key=hook-1", submitToken, `{"again":true}`, http.StatusAccepted, nil)

	got := e.signals(id)
	require.Len(t, got, 2)
	require.Equal(t, "bank/paid", got[0].Topic)
	require.JSONEq(t, `{"amount":12}`, string(got[0].Payload))
	require.Empty(t, got[0].Key)
	require.Equal(t, "approval", got[1].Topic)
	require.Equal(t, "hook-1", got[1].Key)
	require.JSONEq(t, `null`, string(got[1].Payload), "no body sends null")
	require.Greater(t, got[1].Seq, got[0].Seq)
	require.False(t, got[0].At.IsZero())

	failed := e.submit(web.SubmitBody{Behavior: failKind.ID})
	_, err := e.srv.Await(e.ctx, failed)
	require.NoError(t, err)

	big := `"` + strings.Repeat("a", api.MaxSignalBytes) + `"`
	for _, c := range []struct {
		name          string
		path          string
		header        http.Header
		body          string
		status        int
		code, field   string
		wantInMessage string
	}{
		{"a bad topic", base + "bad%20topic", nil, `{}`, http.StatusBadRequest, web.CodeInvalid, "topic", "bad topic"},
		{"a topic too long", base + strings.Repeat("t", 129), nil, `{}`, http.StatusBadRequest, web.CodeInvalid, "topic", ""},
		{"a bad key", base + "approval?key=bad%20key", nil, `{}`, http.StatusBadRequest, web.CodeInvalid, "key", "bad key"},
		{"an empty key", base + "approval?key=", nil, `{}`, http.StatusBadRequest, web.CodeInvalid, "key", "empty"},
		{"keys that differ", base + "approval?key=k1", http.Header{web.IdempotencyKeyHeader: {"k2"}}, `{}`, http.StatusBadRequest, web.CodeInvalid, "key", "differ"},
		{"two key headers", base + "approval", http.Header{web.IdempotencyKeyHeader: {"k1", "k2"}}, `{}`, http.StatusBadRequest, web.CodeInvalid, "key", "2 times"},
		{"an unknown parameter", base + "approval?bogus=1", nil, `{}`, http.StatusBadRequest, web.CodeInvalid, "bogus", ""},
		{"malformed JSON", base + "approval", nil, `{"a":`, http.StatusBadRequest, web.CodeInvalid, "body", "truncated"},
		{"two JSON values", base + "approval", nil, `1 2`, http.StatusBadRequest, web.CodeInvalid, "body", "more than one"},
		{"a payload jsonb refuses", base + "approval", nil, `"\u0000"`, http.StatusBadRequest, web.CodeInvalid, "payload", ""},
		{"a payload over 1 MiB", base + "approval", nil, big, http.StatusRequestEntityTooLarge, web.CodeInvalid, "body", "1 MiB"},
		{"not JSON", base + "approval", http.Header{"Content-Type": {"text/plain"}}, `{}`, http.StatusUnsupportedMediaType, web.CodeInvalid, "Content-Type", ""},
		{"no such task", "/api/v1/tasks/no-such-task/signals/approval", nil, `{}`, http.StatusNotFound, web.CodeNotFound, "", "task no-such-task not found"},
		{"a finished task", "/api/v1/tasks/" + string(failed) + "/signals/approval", nil, `{}`, http.StatusConflict, web.CodeConflict, "", "finished"},
	} {
		r := e.doWith(http.MethodPost, c.path, submitToken, c.header, c.body)
		require.Equal(t, c.status, r.status, "%s: %s", c.name, r.body)
		var ae apiError
		require.NoError(t, json.Unmarshal(r.body, &ae), "%s: %s", c.name, r.body)
		require.Equal(t, c.code, ae.Error.Code, "%s: %s", c.name, r.body)
		require.Equal(t, c.field, ae.Error.Field, "%s: %s", c.name, r.body)
		require.Contains(t, ae.Error.Message, c.wantInMessage, c.name)
	}
	require.Len(t, e.signals(id), 2, "bad input stored nothing")
	require.Empty(t, e.signals(failed))
	e.requireError(http.MethodPost, base+"approval", readToken, `{}`, http.StatusForbidden, web.CodeForbidden, "")
	e.requireError(http.MethodPost, base+"approval", "", `{}`, http.StatusUnauthorized, web.CodeUnauthorized, "")

	// An id with a segment "signals" writes the slash before it as %2F;
	// the topic is the rest of the path, slashes and all.
	odd := e.submit(web.SubmitBody{Behavior: idleKind.ID, ID: "x/signals/y"})
	e.json(http.MethodPost, "/api/v1/tasks/x%2Fsignals/y/signals/a/signals/b", submitToken, `1`, http.StatusAccepted, &sent)
	require.Equal(t, odd, sent.ID)
	require.Equal(t, "a/signals/b", sent.Topic)
	require.Len(t, e.signals(odd), 1)

	// A path under /tasks/ that ends in no action names the signals route.
	ae := e.requireError(http.MethodPost, "/api/v1/tasks/x/bogus", adminToken, nil, http.StatusMethodNotAllowed, web.CodeMethodNotAllowed, "")
	require.Contains(t, ae.Error.Message, "also POST /api/v1/tasks/{id}/signals/{topic}")
}

// TestSignalWakesTaskOverHTTP: a task asleep on a topic shows the wait in
// its read and in lists; the signal sent over HTTP wakes it, and its run
// consumes the message.
func TestSignalWakesTaskOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.submit(web.SubmitBody{Behavior: failKind.ID, Params: json.RawMessage(`{"note":"approve"}`)})
	var task api.Task
	e.waitFor("the task to sleep on its signal", func() bool {
		task = api.Task{} // decoded afresh, as below
		e.json(http.MethodGet, "/api/v1/tasks/"+string(id), readToken, nil, http.StatusOK, &task)
		return task.Waiting != nil
	})
	require.Equal(t, api.StatusScheduled, task.Status)
	require.Equal(t, api.Wait{Reason: api.WaitSignal, Key: "approval", Detail: "signal approval"}, *task.Waiting)
	var page api.Page
	e.json(http.MethodGet, "/api/v1/tasks?behavior="+string(failKind.ID), readToken, nil, http.StatusOK, &page)
	require.Len(t, page.Tasks, 1)
	require.Equal(t, task.Waiting, page.Tasks[0].Waiting, "a list shows the wait too")

	e.json(http.MethodPost, "/api/v1/tasks/"+string(id)+"/signals/approval", submitToken, `{"by":"ann"}`, http.StatusAccepted, nil)
	done, err := e.srv.Await(e.ctx, id)
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, done.Status, "%+v", done.Error)
	require.Empty(t, e.signals(id), "the run consumed it")
}

// TestSignalWorkflowNodeOverHTTP: POST
// /workflows/{id}/nodes/{name}/signals/{topic} signals the node's task;
// an unknown workflow or node, or a task that is no workflow, is a 404
// that says which, and stores nothing.
func TestSignalWorkflowNodeOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	body := web.WorkflowBody{ID: "release-7", Nodes: []web.WorkflowNodeBody{
		{Name: "build", Task: web.SubmitBody{Behavior: idleKind.ID}},
		{Name: "approve", Task: web.SubmitBody{Behavior: idleKind.ID}, DependsOn: []string{"build"}},
	}}
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, body, http.StatusCreated, nil)
	plain := e.submit(web.SubmitBody{Behavior: idleKind.ID, ID: "plain"})

	var sent web.SignalResponse
	e.json(http.MethodPost, "/api/v1/workflows/release-7/nodes/approve/signals/approval?key=k1", submitToken, `{"ok":true}`, http.StatusAccepted, &sent)
	require.Equal(t, web.SignalResponse{ID: "release-7/approve", Topic: "approval", Key: "k1"}, sent)
	got := e.signals("release-7/approve")
	require.Len(t, got, 1, "a waiting node keeps its signal")
	require.JSONEq(t, `{"ok":true}`, string(got[0].Payload))

	for _, c := range []struct{ path, want string }{
		{"/api/v1/workflows/release-7/nodes/deploy/signals/approval", `workflow release-7 has no node "deploy"`},
		{"/api/v1/workflows/release-8/nodes/approve/signals/approval", "workflow release-8 not found"},
		{"/api/v1/workflows/" + string(plain) + "/nodes/approve/signals/approval", "workflow plain not found"},
	} {
		ae := e.requireError(http.MethodPost, c.path, submitToken, `{}`, http.StatusNotFound, web.CodeNotFound, "")
		require.Equal(t, c.want, ae.Error.Message, c.path)
	}
	e.requireError(http.MethodPost, "/api/v1/workflows/release-7/nodes/approve/signals/bad%20topic", submitToken, `{}`, http.StatusBadRequest, web.CodeInvalid, "topic")
	e.requireError(http.MethodPost, "/api/v1/workflows/release-7/nodes/approve/signals/approval", submitToken, `{`, http.StatusBadRequest, web.CodeInvalid, "body")
	e.requireError(http.MethodPost, "/api/v1/workflows/release-7/nodes/approve/signals/approval", readToken, `{}`, http.StatusForbidden, web.CodeForbidden, "")
	require.Len(t, e.signals("release-7/approve"), 1, "bad input stored nothing")
	require.Empty(t, e.signals("release-7/build"))
}

// TestGateOverHTTP: a gate submitted over HTTP waits for its signal,
// which POST /workflows/{id}/nodes/{name}/signals/{topic} sends; it
// succeeds with the payload, and so does its workflow. A gate with a bad
// topic is refused whole.
func TestGateOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var body web.WorkflowBody
	require.NoError(t, json.Unmarshal([]byte(`{"id": "order-7", "nodes": [
		{"name": "approve", "task": {}, "gate": {"topic": "approval", "timeout": "72h"}}]}`), &body))
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, body, http.StatusCreated, nil)
	e.waitFor("the gate to wait for its signal", func() bool {
		w := e.task("order-7/approve").Waiting
		return w != nil && w.Reason == api.WaitSignal
	})
	require.Equal(t, "signal approval", e.task("order-7/approve").Waiting.Detail)

	e.json(http.MethodPost, "/api/v1/workflows/order-7/nodes/approve/signals/approval", submitToken, `{"by":"ann"}`, http.StatusAccepted, nil)
	w, err := e.srv.AwaitWorkflow(e.ctx, "order-7")
	require.NoError(t, err)
	require.Equal(t, api.WorkflowSucceeded, w.State)
	node, _ := w.Node("approve")
	require.JSONEq(t, `{"by":"ann"}`, string(node.Task.Result))

	bad := web.WorkflowBody{ID: "order-8", Nodes: []web.WorkflowNodeBody{{Name: "approve", Gate: &api.Gate{Topic: "bad topic", Timeout: time.Hour}}}}
	ae := e.requireError(http.MethodPost, "/api/v1/workflows", submitToken, bad, http.StatusBadRequest, web.CodeInvalid, "nodes")
	require.Contains(t, ae.Error.Message, "bad topic")
	e.requireError(http.MethodGet, "/api/v1/workflows/order-8", readToken, nil, http.StatusNotFound, web.CodeNotFound, "")
}

// reopening is test.fail whose policy reopens its finished tasks on a
// signal (spi.Policy.ReopenOnSignal).
type reopening struct{ testBehavior }

func (reopening) Policy() spi.Policy { return spi.Policy{ReopenOnSignal: true} }

// TestSignalReopensOverHTTP: a signal to a finished task is a 409 through
// a client whose registry's policy of the behavior does not reopen it,
// and a 202 through one whose policy does: the task runs again and its
// run receives the message.
func TestSignalReopensOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.submit(web.SubmitBody{Behavior: failKind.ID, Params: json.RawMessage(`{"note":"approve"}`)})
	path := "/api/v1/tasks/" + string(id) + "/signals/approval"
	e.json(http.MethodPost, path, submitToken, `{"by":"ann"}`, http.StatusAccepted, nil)
	first, err := e.srv.Await(e.ctx, id)
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, first.Status, "%+v", first.Error)
	e.requireError(http.MethodPost, path, submitToken, `{"by":"bob"}`, http.StatusConflict, web.CodeConflict, "")

	reg := spi.NewRegistry()
	require.NoError(t, spi.Register(reg, spi.Behavior[noteParams, struct{}](reopening{testBehavior{failKind}})))
	c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	cfg := e.cfg
	cfg.Client = c
	h, err := web.New(cfg)
	require.NoError(t, err)
	e.ts = httptest.NewServer(h)
	t.Cleanup(e.ts.Close)
	var sent web.SignalResponse
	e.json(http.MethodPost, path, submitToken, `{"by":"bob"}`, http.StatusAccepted, &sent)
	require.Equal(t, web.SignalResponse{ID: id, Topic: "approval"}, sent)
	var task api.Task
	e.waitFor("the task to run again", func() bool {
		// Each answer is decoded afresh: one decoded over the last would
		// keep the fields the new one leaves out (signals, a due time).
		task = api.Task{}
		e.json(http.MethodGet, "/api/v1/tasks/"+string(id), readToken, nil, http.StatusOK, &task)
		return task.Status == api.StatusSuccess && task.FinishedAt.After(*first.FinishedAt)
	})
	require.Empty(t, task.Signals, "the run received the message")
}
