package web_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/replication"
	"github.com/stinthq/stint/web"
)

// The secrets of a replication's params, each in one shape of DSN.
var replicationSecrets = []string{"one Secret", "url-Secret", "query-Secret"}

// replicationParams are a replication's params holding replicationSecrets.
var replicationParams = json.RawMessage(`{
	"source": {"dsn": "host=h user=u password='part one Secret' dbname=d", "table": "t"},
	"target": {"dsn": "postgres://u:url-Secret@h/d?password=query-Secret&sslmode=disable", "table": "t"},
	"change_column": "v"}`)

// requireNoSecret fails the test if an answer shows a secret.
func requireNoSecret(t *testing.T, what string, body []byte) {
	t.Helper()
	for _, s := range replicationSecrets {
		require.NotContains(t, string(body), s, "%s shows a password: %s", what, body)
	}
}

// Every answer that holds a task's params shows them redacted, the admin
// actions' answers too (the dashboard redraws a task from them), while
// the task keeps them whole for its runs.
func TestAnswersShowNoPassword(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.submit(web.SubmitBody{Behavior: replication.OneShotBehavior, Params: replicationParams})
	path := "/api/v1/tasks/" + string(id)

	answer := func(method, path string, body any, want api.Status) {
		t.Helper()
		r := e.do(method, path, adminToken, body)
		require.Equal(t, http.StatusOK, r.status, "%s %s: %s", method, path, r.body)
		requireNoSecret(t, method+" "+path, r.body)
		var task api.Task
		require.NoError(t, json.Unmarshal(r.body, &task))
		if want != "" {
			require.Equal(t, want, task.Status)
		}
		require.Contains(t, string(task.Params), "password=xxxxx", "the params are shown, redacted")
	}
	answer(http.MethodPost, path+"/hold", nil, api.StatusHeld)
	answer(http.MethodPost, path+"/release", nil, api.StatusScheduled)
	answer(http.MethodPost, path+"/fail", web.FailBody{Reason: "by hand"}, api.StatusFailure)
	answer(http.MethodPost, path+"/retry", nil, api.StatusScheduled)
	answer(http.MethodGet, path, nil, "")

	r := e.do(http.MethodGet, "/api/v1/tasks?behavior=replication", readToken, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Contains(t, string(r.body), string(id))
	requireNoSecret(t, "the task list", r.body)

	require.NoError(t, e.srv.AddSchedule(e.ctx, api.Schedule{Name: "nightly-copy", Behavior: replication.OneShotBehavior,
		Spec: "@daily", Params: replicationParams}))
	r = e.do(http.MethodGet, "/api/v1/schedules", readToken, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Contains(t, string(r.body), "nightly-copy")
	requireNoSecret(t, "the schedule list", r.body)

	wf := web.WorkflowBody{ID: "wf-secret", Nodes: []web.WorkflowNodeBody{
		{Name: "copy", Task: web.SubmitBody{Behavior: replication.OneShotBehavior, Params: replicationParams, Delay: "1h"}}}}
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, wf, http.StatusCreated, nil)
	r = e.do(http.MethodGet, "/api/v1/workflows/wf-secret", readToken, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Contains(t, string(r.body), "password=xxxxx")
	requireNoSecret(t, "a workflow", r.body)

	stored, err := e.srv.Get(e.ctx, id)
	require.NoError(t, err)
	for _, s := range replicationSecrets {
		require.Contains(t, string(stored.Params), s, "the task keeps its params whole for its runs")
	}
}
