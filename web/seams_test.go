package web_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/web"
)

// TestSubmitsCannotTakeOverAnotherTask: over HTTP, with a submit token or
// an admin one, a submit whose id holds a task of another behavior, a
// workflow or a workflow's node is refused with 409 and changes nothing,
// for every pair of behaviors; the admin's retry of a skipped node is
// refused too.
func TestSubmitsCannotTakeOverAnotherTask(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bodies := map[api.BehaviorID]web.SubmitBody{
		"demo.echo": {Behavior: "demo.echo", Params: json.RawMessage(`{"text":"x"}`)},
		"test.fail": {Behavior: "test.fail"},
		"test.idle": {Behavior: "test.idle"},
		"replication": {Behavior: "replication", Params: json.RawMessage(
			`{"source":{"dsn":"postgres://localhost/a","table":"s"},"target":{"dsn":"postgres://localhost/b","table":"t"},"change_column":"seq"}`)},
	}
	for b, body := range bodies {
		body.ID = api.TaskID("held-by-" + string(b))
		var sub api.Submission
		e.json(http.MethodPost, "/api/v1/tasks", submitToken, body, http.StatusCreated, &sub)
	}
	var wsub api.WorkflowSubmission
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, web.WorkflowBody{ID: "wf-seam", Nodes: []web.WorkflowNodeBody{
		{Name: "fails", Task: bodies["test.fail"]},
		{Name: "skipped", Task: bodies["demo.echo"], DependsOn: []string{"fails"}},
		{Name: "echo", Task: bodies["demo.echo"]},
	}}, http.StatusCreated, &wsub)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var wf api.Workflow
		e.json(http.MethodGet, "/api/v1/workflows/wf-seam", readToken, nil, http.StatusOK, &wf)
		if wf.State != api.WorkflowRunning {
			require.Equal(t, api.WorkflowFailed, wf.State)
			break
		}
		require.True(t, time.Now().Before(deadline), "the workflow did not end")
		time.Sleep(50 * time.Millisecond) // polling the API, as a user would; the deadline bounds it
	}
	// The workflow's own task records the outcome after its nodes ended.
	_, err := e.srv.Await(e.ctx, "wf-seam")
	require.NoError(t, err)
	snapshot := func() map[api.TaskID]api.Task {
		var page api.Page
		e.json(http.MethodGet, "/api/v1/tasks?limit=100&fields=payloads", readToken, nil, http.StatusOK, &page)
		out := map[api.TaskID]api.Task{}
		for _, task := range page.Tasks {
			task.UpdatedAt = time.Time{}
			out[task.ID] = task
		}
		return out
	}
	before := snapshot()
	for _, token := range []string{submitToken, adminToken} {
		for b, body := range bodies {
			for stored := range bodies {
				if stored == b {
					continue
				}
				body.ID = api.TaskID("held-by-" + string(stored))
				e.requireError(http.MethodPost, "/api/v1/tasks", token, body, http.StatusConflict, web.CodeConflict, "")
			}
			for _, id := range []api.TaskID{"wf-seam", "wf-seam/echo", "wf-seam/skipped"} {
				body.ID = id
				e.requireError(http.MethodPost, "/api/v1/tasks", token, body, http.StatusConflict, web.CodeConflict, "")
			}
		}
		e.requireError(http.MethodPost, "/api/v1/workflows", token, web.WorkflowBody{ID: "held-by-demo.echo",
			Nodes: []web.WorkflowNodeBody{{Name: "a", Task: bodies["demo.echo"]}}}, http.StatusConflict, web.CodeConflict, "")
	}
	e.requireError(http.MethodPost, "/api/v1/tasks/"+url.PathEscape("wf-seam/skipped")+"/retry", adminToken, nil,
		http.StatusConflict, web.CodeConflict, "")
	e.requireError(http.MethodPost, "/api/v1/tasks/"+url.PathEscape("wf-seam/echo")+"/retry", adminToken, nil,
		http.StatusConflict, web.CodeConflict, "")
	e.requireError(http.MethodDelete, "/api/v1/tasks/"+url.PathEscape("wf-seam/echo"), adminToken, nil,
		http.StatusConflict, web.CodeConflict, "")
	require.Equal(t, before, snapshot(), "the refused operations changed nothing")

	// Retrying the failed node over HTTP runs the workflow again from it:
	// the node it skipped waits for it again, and is skipped again once it
	// failed again (which may come before the read below).
	skippedAt := before["wf-seam/skipped"].FinishedAt
	r := e.do(http.MethodPost, "/api/v1/tasks/"+url.PathEscape("wf-seam/fails")+"/retry", adminToken, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var task api.Task
	e.json(http.MethodGet, "/api/v1/tasks/"+url.PathEscape("wf-seam/skipped"), readToken, nil, http.StatusOK, &task)
	require.True(t, task.Status == api.StatusWaiting || task.FinishedAt != nil && task.FinishedAt.After(*skippedAt),
		"the node its failure skipped waits for it again: %+v", task)
}
