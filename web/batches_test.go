package web_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/behaviors/ingest"
	"github.com/stinthq/stint/web"
)

// submitBatch submits an ingest batch of profile that no node runs.
func (e *testEnv) submitBatch(profile, submitter string) api.TaskID {
	e.t.Helper()
	f, err := ingest.SubmitBatch(e.ctx, e.srv, ingest.BatchParams{Submitter: submitter, Profile: profile, PayloadURL: "http://127.0.0.1:1/object.txt"})
	require.NoError(e.t, err)
	return f.ID()
}

func TestBatchEndpoints(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var who struct {
		Features []string `json:"features"`
	}
	e.json(http.MethodGet, "/api/v1/whoami", readToken, nil, http.StatusOK, &who)
	require.Equal(t, []string{ingest.Feature}, who.Features)

	a := e.submitBatch("coll-a", "alice")
	b := e.submitBatch("coll-b", "bob")

	var page ingest.BatchesResponse
	e.json(http.MethodGet, "/api/v1/batches", readToken, nil, http.StatusOK, &page)
	require.Len(t, page.Batches, 2)
	e.json(http.MethodGet, "/api/v1/batches?profile=coll-b", readToken, nil, http.StatusOK, &page)
	require.Len(t, page.Batches, 1)
	require.Equal(t, b, page.Batches[0].ID)
	require.Equal(t, "bob", page.Batches[0].Submitter)
	require.Equal(t, ingest.BatchPending, page.Batches[0].Status)
	require.Equal(t, api.StatusScheduled, page.Batches[0].TaskStatus)

	// Keyset paging: one at a time.
	var ids []api.TaskID
	after := ""
	for range 3 {
		page = ingest.BatchesResponse{} // "next" is absent on the last page
		e.json(http.MethodGet, "/api/v1/batches?limit=1&after="+after, readToken, nil, http.StatusOK, &page)
		for _, v := range page.Batches {
			ids = append(ids, v.ID)
		}
		if page.Next == "" {
			break
		}
		after = string(page.Next)
	}
	require.Empty(t, page.Next, "two pages of one")
	require.ElementsMatch(t, []api.TaskID{a, b}, ids)

	var batch ingest.BatchView
	e.json(http.MethodGet, "/api/v1/batches/"+string(a), readToken, nil, http.StatusOK, &batch)
	require.Equal(t, a, batch.ID)
	require.Equal(t, "coll-a", batch.Profile)
	require.Empty(t, batch.Jobs, "the batch has not run")

	// A held profile shows on its batches.
	e.json(http.MethodPost, "/api/v1/groups/coll-a/hold", adminToken, nil, http.StatusOK, nil)
	e.json(http.MethodGet, "/api/v1/batches/"+string(a), readToken, nil, http.StatusOK, &batch)
	require.True(t, batch.CollectionHeld)

	// Errors.
	e.requireError(http.MethodGet, "/api/v1/batches/no-such-batch", readToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	e.requireError(http.MethodGet, "/api/v1/jobs/no-such-job", readToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	echo := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"not a batch"}`)})
	e.requireError(http.MethodGet, "/api/v1/batches/"+string(echo), readToken, nil, http.StatusBadRequest, web.CodeInvalid, "id")
	e.requireError(http.MethodGet, "/api/v1/jobs/"+string(a), readToken, nil, http.StatusBadRequest, web.CodeInvalid, "id")
	e.requireError(http.MethodGet, "/api/v1/batches/a%20b", readToken, nil, http.StatusBadRequest, web.CodeInvalid, "id")
	for param, value := range map[string]string{"limit": "0", "profile": "", "after": "a%20b", "bogus": "1"} {
		e.requireError(http.MethodGet, "/api/v1/batches?"+param+"="+value, readToken, nil, http.StatusBadRequest, web.CodeInvalid, param)
	}
	e.requireError(http.MethodGet, "/api/v1/batches", "", nil, http.StatusUnauthorized, web.CodeUnauthorized, "")
}

// The Merritt actions on batches and jobs are for admin tokens only, and
// follow the state table.
func TestBatchActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.submitBatch("coll-act", "dora")
	path := "/api/v1/batches/" + string(a)

	// Weaker roles are refused, and nothing changes.
	for _, token := range []string{readToken, submitToken} {
		e.requireError(http.MethodPost, path+"/hold", token, nil, http.StatusForbidden, web.CodeForbidden, "")
		e.requireError(http.MethodPost, path+"/requeue", token, nil, http.StatusForbidden, web.CodeForbidden, "")
		e.requireError(http.MethodDelete, path, token, nil, http.StatusForbidden, web.CodeForbidden, "")
	}
	var batch ingest.BatchView
	e.json(http.MethodGet, path, readToken, nil, http.StatusOK, &batch)
	require.Equal(t, ingest.BatchPending, batch.Status)

	// Admin: hold, release, hold again, delete.
	e.json(http.MethodPost, path+"/hold", adminToken, nil, http.StatusOK, &batch)
	require.Equal(t, ingest.BatchHeld, batch.Status)
	e.requireError(http.MethodPost, path+"/hold", adminToken, nil, http.StatusConflict, web.CodeConflict, "")
	e.json(http.MethodPost, path+"/release", adminToken, nil, http.StatusOK, &batch)
	require.Equal(t, ingest.BatchPending, batch.Status)
	e.requireError(http.MethodPost, path+"/requeue", adminToken, nil, http.StatusConflict, web.CodeConflict, "")
	e.requireError(http.MethodDelete, path, adminToken, nil, http.StatusConflict, web.CodeConflict, "")
	e.json(http.MethodPost, path+"/hold", adminToken, nil, http.StatusOK, &batch)
	e.json(http.MethodDelete, path, adminToken, nil, http.StatusNoContent, nil)
	e.requireError(http.MethodGet, path, readToken, nil, http.StatusNotFound, web.CodeNotFound, "")

	// Bad ids, and ids of the other kind.
	e.requireError(http.MethodPost, "/api/v1/batches/no-such-batch/hold", adminToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	e.requireError(http.MethodDelete, "/api/v1/jobs/no-such-job", adminToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	b := e.submitBatch("coll-act", "dora")
	e.requireError(http.MethodPost, "/api/v1/jobs/"+string(b)+"/requeue", adminToken, nil, http.StatusBadRequest, web.CodeInvalid, "id")
	echo := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"not a batch"}`)})
	e.requireError(http.MethodPost, "/api/v1/batches/"+string(echo)+"/hold", adminToken, nil, http.StatusBadRequest, web.CodeInvalid, "id")
	e.requireError(http.MethodPost, "/api/v1/batches/a%20b/hold", adminToken, nil, http.StatusBadRequest, web.CodeInvalid, "id")
}
