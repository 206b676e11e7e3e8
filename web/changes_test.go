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

func TestRecentChanges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var resp web.ChangesResponse
	e.json(http.MethodGet, "/api/v1/changes", readToken, nil, http.StatusOK, &resp)
	require.NotNil(t, resp.Changes)
	require.Empty(t, resp.Changes, "nothing happened yet")

	id := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"recent"}`)})
	_, err := e.srv.Await(e.ctx, id)
	require.NoError(t, err)
	e.json(http.MethodGet, "/api/v1/changes", readToken, nil, http.StatusOK, &resp)
	var statuses []api.Status
	for _, c := range resp.Changes {
		require.Equal(t, id, c.TaskID)
		statuses = append(statuses, c.Status)
	}
	require.Equal(t, []api.Status{api.StatusSuccess, api.StatusRunning, api.StatusScheduled}, statuses, "newest first")
	e.json(http.MethodGet, "/api/v1/changes?limit=1", readToken, nil, http.StatusOK, &resp)
	require.Len(t, resp.Changes, 1)
	require.Equal(t, api.StatusSuccess, resp.Changes[0].Status)

	for _, bad := range []string{"0", "1001", "x"} {
		e.requireError(http.MethodGet, "/api/v1/changes?limit="+bad, readToken, nil, http.StatusBadRequest, web.CodeInvalid, "limit")
	}
	e.requireError(http.MethodGet, "/api/v1/changes?since=1", readToken, nil, http.StatusBadRequest, web.CodeInvalid, "since")
	e.requireError(http.MethodGet, "/api/v1/changes", "", nil, http.StatusUnauthorized, web.CodeUnauthorized, "")
}
