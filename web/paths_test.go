package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/ingest"
	"github.com/stinthq/stint/web"
)

// An id with slashes is written in a path as it is, or with its slashes
// as %2F: the endpoint's literal end (an action, or none) decides the
// route, so that an id that ends in an action's name is read whole.
func TestPathIDsWithSlashes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := []api.TaskID{"nightly/merge", "a/b/c", "x/hold", "y/retry/release"}
	for _, id := range ids {
		e.submit(web.SubmitBody{Behavior: idleKind.ID, ID: id})
	}
	for _, id := range ids {
		for _, path := range []string{string(id), url.PathEscape(string(id))} {
			base := "/api/v1/tasks/" + path
			var task api.Task
			e.json(http.MethodGet, base, readToken, nil, http.StatusOK, &task)
			require.Equal(t, id, task.ID, "GET %s", base)
			r := e.do(http.MethodGet, base+"?wait=10ms", readToken, nil)
			require.Equal(t, http.StatusOK, r.status, "GET %s?wait: %s", base, r.body)
			require.Equal(t, web.WaitTimeout, r.header.Get(web.WaitHeader))

			e.json(http.MethodPost, base+"/hold", adminToken, nil, http.StatusOK, &task)
			require.Equal(t, id, task.ID, "POST %s/hold", base)
			require.Equal(t, api.StatusHeld, task.Status)
			e.json(http.MethodPost, base+"/release", adminToken, nil, http.StatusOK, &task)
			require.Equal(t, api.StatusScheduled, task.Status, "POST %s/release", base)
		}
	}
	// A slash written %2F is never the one before an action.
	e.requireError(http.MethodGet, "/api/v1/tasks/nightly%2Fmerge%2Fhold", readToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	e.json(http.MethodPost, "/api/v1/tasks/x%2Fhold/hold", adminToken, nil, http.StatusOK, nil)
	require.Equal(t, api.StatusHeld, e.task("x/hold").Status)
	ae := e.requireError(http.MethodPost, "/api/v1/tasks/x%2Fhold", adminToken, nil, http.StatusMethodNotAllowed, web.CodeMethodNotAllowed, "")
	require.Contains(t, ae.Error.Message, "fail, fork, hold, release, retry, rewind", "the 405 lists the actions")
	e.json(http.MethodPost, "/api/v1/tasks/x/hold/fail", adminToken, web.FailBody{Reason: "by hand"}, http.StatusOK, nil)
	require.Equal(t, api.StatusFailure, e.task("x/hold").Status)

	for _, id := range ids {
		r := e.do(http.MethodDelete, "/api/v1/tasks/"+string(id), adminToken, nil)
		require.Equal(t, http.StatusNoContent, r.status, "DELETE %s: %s", id, r.body)
	}
	e.requireError(http.MethodGet, "/api/v1/tasks/nightly/merge", readToken, nil, http.StatusNotFound, web.CodeNotFound, "")

	// The routes of other parts too: an ingest job's id has a slash.
	ae = e.requireError(http.MethodGet, "/api/v1/jobs/"+string(ingest.JobID("no-such-batch", 3)), readToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	require.NotContains(t, ae.Error.Message, "no endpoint", "the job's route answers")
	// And group keys.
	e.json(http.MethodPost, "/api/v1/groups/coll/a/hold", adminToken, nil, http.StatusOK, nil)
	groups, err := e.srv.HeldGroups(e.ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"coll/a"}, groups)
	e.json(http.MethodPost, "/api/v1/groups/coll/a/release", adminToken, nil, http.StatusOK, nil)

	// A path under a known prefix that ends in no action of its method.
	ae = e.requireError(http.MethodPost, "/api/v1/tasks/nightly/merge/bogus", adminToken, nil, http.StatusMethodNotAllowed, web.CodeMethodNotAllowed, "")
	require.True(t, strings.Contains(ae.Error.Message, "POST /api/v1/tasks/{id}/ACTION takes the actions fail, fork, hold, release, retry, rewind"), "%s", ae.Error.Message)
	ae = e.requireError(http.MethodPost, "/api/v1/workflows/w/bogus", adminToken, nil, http.StatusMethodNotAllowed, web.CodeMethodNotAllowed, "")
	require.Contains(t, ae.Error.Message, "cancel, hold, release, retry")
}
