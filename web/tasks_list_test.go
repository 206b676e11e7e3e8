package web_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/web"
)

// TestListsLeavePayloadsOut: GET /tasks leaves the tasks' params, result
// and progress out unless fields=payloads asks for them; the task's own
// read has them; an unknown fields value is refused.
func TestListsLeavePayloadsOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.submit(web.SubmitBody{Behavior: "demo.echo", Params: json.RawMessage(`{"text":"big enough"}`)})
	_, err := e.srv.Await(e.ctx, id)
	require.NoError(t, err)

	var page api.Page
	e.json(http.MethodGet, "/api/v1/tasks?behavior=demo.echo", readToken, nil, http.StatusOK, &page)
	require.Len(t, page.Tasks, 1)
	left := func(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }
	require.True(t, left(page.Tasks[0].Params), "params left out: %s", page.Tasks[0].Params)
	require.True(t, left(page.Tasks[0].Result), "result left out: %s", page.Tasks[0].Result)
	require.Equal(t, api.StatusSuccess, page.Tasks[0].Status, "the rest is there")

	e.json(http.MethodGet, "/api/v1/tasks?behavior=demo.echo&fields=payloads", readToken, nil, http.StatusOK, &page)
	require.JSONEq(t, `{"text":"big enough"}`, string(page.Tasks[0].Params))
	require.NotNil(t, page.Tasks[0].Result)

	var task api.Task
	e.json(http.MethodGet, "/api/v1/tasks/"+string(id), readToken, nil, http.StatusOK, &task)
	require.JSONEq(t, `{"text":"big enough"}`, string(task.Params))
	e.requireError(http.MethodGet, "/api/v1/tasks?fields=everything", readToken, nil, http.StatusBadRequest, "invalid", "fields")
}
