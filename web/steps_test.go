package web_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/web"
)

// awaitFinished waits with ?wait until the task at path finished for
// good, and reads it whole (steps included).
func (e *testEnv) awaitFinished(path string) api.Task {
	e.t.Helper()
	var task api.Task
	e.json(http.MethodGet, path+"?wait=30s", readToken, nil, http.StatusOK, &task)
	require.True(e.t, task.Finished(), "%s: %s", path, task.Status)
	e.json(http.MethodGet, path, readToken, nil, http.StatusOK, &task)
	return task
}

// echoFrom returns the step a demo.echo run resumed from.
func echoFrom(t *testing.T, task api.Task) int {
	t.Helper()
	var res demo.EchoResult
	require.NoError(t, json.Unmarshal(task.Result, &res), "%s", task.Result)
	return res.From
}

// TestRewindAndForkOverHTTP lists a task's steps in GET /tasks/{id},
// refuses each bad rewind and fork without changing anything, then
// forks the task from step 1 to an id with a slash and rewinds that copy
// to step 2, through the copy's path as written.
func TestRewindAndForkOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"hi","steps":3}`)})
	path := "/api/v1/tasks/" + string(id)
	task := e.awaitFinished(path)
	require.Len(t, task.Steps, 3)
	for i, s := range task.Steps {
		require.Equal(t, i+1, s.N)
		require.JSONEq(t, `{"done":`+string(rune('1'+i))+`}`, string(s.Progress))
		require.False(t, s.At.IsZero())
	}

	for _, tc := range []struct {
		name, action string
		token        string
		body         any
		status       int
		code, field  string
	}{
		{"rewind without a body", "rewind", adminToken, nil, http.StatusBadRequest, web.CodeInvalid, "body"},
		{"rewind to step 0", "rewind", adminToken, web.RewindBody{}, http.StatusBadRequest, web.CodeInvalid, "step"},
		{"rewind with an unknown field", "rewind", adminToken, `{"step":1,"to":2}`, http.StatusBadRequest, web.CodeInvalid, "to"},
		{"rewind to an unknown step", "rewind", adminToken, web.RewindBody{Step: 9}, http.StatusNotFound, web.CodeNotFound, ""},
		{"rewind as submitter", "rewind", submitToken, web.RewindBody{Step: 1}, http.StatusForbidden, web.CodeForbidden, ""},
		{"fork without an id", "fork", adminToken, web.ForkBody{Step: 1}, http.StatusBadRequest, web.CodeInvalid, "id"},
		{"fork to a bad id", "fork", adminToken, web.ForkBody{Step: 1, ID: "a b"}, http.StatusBadRequest, web.CodeInvalid, "id"},
		{"fork from step -1", "fork", adminToken, web.ForkBody{Step: -1, ID: "copy-1"}, http.StatusBadRequest, web.CodeInvalid, "step"},
		{"fork onto itself", "fork", adminToken, web.ForkBody{Step: 1, ID: id}, http.StatusConflict, web.CodeConflict, ""},
		{"fork as reader", "fork", readToken, web.ForkBody{Step: 1, ID: "copy-1"}, http.StatusForbidden, web.CodeForbidden, ""},
	} {
		t.Log(tc.name)
		e.requireError(http.MethodPost, path+"/"+tc.action, tc.token, tc.body, tc.status, tc.code, tc.field)
	}
	ae := e.requireError(http.MethodPost, path+"/rewind", adminToken, web.RewindBody{Step: 4}, http.StatusNotFound, web.CodeNotFound, "")
	require.Contains(t, ae.Error.Message, "no step 4 (its steps are 1 to 3)")
	e.requireError(http.MethodPost, "/api/v1/tasks/no-such-task/rewind", adminToken, web.RewindBody{Step: 1}, http.StatusNotFound, web.CodeNotFound, "")
	var after api.Task
	e.json(http.MethodGet, path, readToken, nil, http.StatusOK, &after)
	require.Equal(t, task, after, "the refused requests changed nothing")

	r := e.do(http.MethodPost, path+"/fork", adminToken, web.ForkBody{Step: 1, ID: "copy/one"})
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, "/api/v1/tasks/copy%2Fone", r.header.Get("Location"))
	var sub api.Submission
	require.NoError(t, json.Unmarshal(r.body, &sub))
	require.Equal(t, api.Submission{ID: "copy/one", Created: true, Status: api.StatusScheduled}, sub)
	forked := e.awaitFinished("/api/v1/tasks/copy/one")
	require.Equal(t, 1, echoFrom(t, forked), "the copy ran from step 1")
	require.Len(t, forked.Steps, 3)
	require.Equal(t, task.Steps[0], forked.Steps[0], "step 1 is copied as it was")

	var rewound api.Task
	e.json(http.MethodPost, "/api/v1/tasks/copy/one/rewind", adminToken, web.RewindBody{Step: 2}, http.StatusOK, &rewound)
	require.Equal(t, api.TaskID("copy/one"), rewound.ID)
	// The rewound run may end before the answer reads the task: either way
	// the answer is of a run after the fork's.
	require.True(t, !rewound.Finished() || rewound.FinishedAt.After(*forked.FinishedAt),
		"it runs again: finished at %v, the fork's run at %v", rewound.FinishedAt, forked.FinishedAt)
	again := e.awaitFinished("/api/v1/tasks/copy/one")
	require.Equal(t, 2, echoFrom(t, again), "the rewound copy ran from step 2")
	require.Equal(t, forked.Steps[:2], again.Steps[:2])
	e.requireError(http.MethodPost, "/api/v1/tasks/copy/one/fork", adminToken, web.ForkBody{Step: 1, ID: id}, http.StatusConflict, web.CodeConflict, "")
}
