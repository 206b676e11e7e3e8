package web_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/web"
)

// TestTaskEventsOverHTTP: a task's events are listed, read by key, and
// awaited with a long poll that the statement setting the event wakes;
// bad input is refused.
func TestTaskEventsOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.submit(web.SubmitBody{Behavior: "test.idle"})
	path := "/api/v1/tasks/" + string(id) + "/events"
	var got web.EventsResponse
	e.json(http.MethodGet, path, readToken, nil, http.StatusOK, &got)
	require.Empty(t, got.Events)

	e.requireError(http.MethodGet, path+"?key=bad%20key", readToken, nil, http.StatusBadRequest, "invalid", "key")
	e.requireError(http.MethodGet, path+"?wait=1s", readToken, nil, http.StatusBadRequest, "invalid", "key")
	e.requireError(http.MethodGet, path+"?key=k&wait=soon", readToken, nil, http.StatusBadRequest, "invalid", "wait")
	e.requireError(http.MethodGet, "/api/v1/tasks/no-such-task/events", readToken, nil, http.StatusNotFound, "not_found", "")

	answered := make(chan response, 1)
	go func() { answered <- e.do(http.MethodGet, path+"?key=progress&wait=30s", readToken, nil) }()
	// Set the event as a run's statement does, and notify, until the
	// long poll answers (it may not have begun to wait at the first).
	_, err := e.st.Pool().Exec(e.ctx, `INSERT INTO stint_event (task_id, key, value, at, created)
		SELECT id, 'progress', '{"pct": 50}', now(), created_at FROM stint_task WHERE id = $1`, string(id))
	require.NoError(t, err)
	var r response
	for r.status == 0 {
		_, err := e.st.Pool().Exec(e.ctx, `SELECT pg_notify('stint_finished', $1)`, string(id))
		require.NoError(t, err)
		select {
		case r = <-answered:
		case <-e.ctx.Done():
			t.Fatal("the long poll did not answer")
		case <-time.After(20 * time.Millisecond): // notify again
		}
	}
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, web.WaitSet, r.header.Get(web.WaitHeader))
	require.NoError(t, json.Unmarshal(r.body, &got))
	require.Len(t, got.Events, 1)
	require.Equal(t, "progress", got.Events[0].Key)
	require.JSONEq(t, `{"pct": 50}`, string(got.Events[0].Value))

	r = e.do(http.MethodGet, path+"?key=other&wait=100ms", readToken, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, web.WaitTimeout, r.header.Get(web.WaitHeader))

	var task api.Task
	e.json(http.MethodGet, "/api/v1/tasks/"+string(id), readToken, nil, http.StatusOK, &task)
	require.Len(t, task.Events, 1, "a task's page lists its events")
}
