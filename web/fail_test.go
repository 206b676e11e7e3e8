package web_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/web"
)

// TestFailTask fails a waiting task through the API, after refusing each
// bad request without changing it.
func TestFailTask(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.submit(web.SubmitBody{Behavior: idleKind.ID}) // no node runs test.idle
	path := "/api/v1/tasks/" + string(id) + "/fail"

	for _, tc := range []struct {
		name   string
		token  string
		body   any
		status int
		code   string
		field  string
	}{
		{"no body", adminToken, nil, http.StatusBadRequest, web.CodeInvalid, "body"},
		{"no reason", adminToken, web.FailBody{}, http.StatusBadRequest, web.CodeInvalid, "reason"},
		{"control character", adminToken, web.FailBody{Reason: "a\nb"}, http.StatusBadRequest, web.CodeInvalid, "reason"},
		{"unknown field", adminToken, `{"reason":"r","why":"r"}`, http.StatusBadRequest, web.CodeInvalid, "why"},
		{"bad JSON", adminToken, `{"reason":`, http.StatusBadRequest, web.CodeInvalid, "body"},
		{"submit role", submitToken, web.FailBody{Reason: "r"}, http.StatusForbidden, web.CodeForbidden, ""},
	} {
		t.Log(tc.name)
		e.requireError(http.MethodPost, path, tc.token, tc.body, tc.status, tc.code, tc.field)
	}
	e.requireError(http.MethodPost, "/api/v1/tasks/no-such-task/fail", adminToken, web.FailBody{Reason: "r"}, http.StatusNotFound, web.CodeNotFound, "")
	var task api.Task
	e.json(http.MethodGet, "/api/v1/tasks/"+string(id), readToken, nil, http.StatusOK, &task)
	require.Equal(t, api.StatusScheduled, task.Status, "the refused requests changed nothing")

	task = api.Task{}
	e.json(http.MethodPost, path, adminToken, web.FailBody{Reason: "known bad"}, http.StatusOK, &task)
	require.Equal(t, api.StatusFailure, task.Status)
	require.True(t, task.Finished())
	require.Equal(t, &api.TaskError{Code: api.FailedByHand, Message: "failed by hand: known bad"}, task.Error)
	ae := e.requireError(http.MethodPost, path, adminToken, web.FailBody{Reason: "again"}, http.StatusConflict, web.CodeConflict, "")
	require.Contains(t, ae.Error.Message, "finished for good")
}

// Params PostgreSQL's jsonb refuses are a 400 naming the member, as a NUL
// character is, not a 500 from the database.
func TestSubmitParamsJSONBRefuses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, tc := range []struct{ params, field string }{
		{`{"text":"\ud800"}`, "params.text"},
		{`{"text":"a\udfffb"}`, "params.text"},
		{`{"text":"\u0000"}`, "params.text"},
	} {
		body := `{"behavior":"demo.echo","params":` + tc.params + `}`
		ae := e.requireError(http.MethodPost, "/api/v1/tasks", submitToken, body, http.StatusBadRequest, web.CodeInvalid, tc.field)
		require.Contains(t, ae.Error.Message, tc.field, tc.params)
	}
	var list api.Page
	e.json(http.MethodGet, "/api/v1/tasks?behavior=demo.echo", readToken, nil, http.StatusOK, &list)
	require.Empty(t, list.Tasks, "nothing is stored")
}
