package web_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/web"
)

// operations returns the operations of an OpenAPI document's paths as
// "METHOD /path", sorted.
func operations(t *testing.T, raw []byte) ([]string, map[string]any) {
	t.Helper()
	var doc struct {
		OpenAPI string                               `json:"openapi"`
		Paths   map[string]map[string]map[string]any `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	require.True(t, strings.HasPrefix(doc.OpenAPI, "3."), "an OpenAPI 3 document: %q", doc.OpenAPI)
	var out []string
	ops := map[string]any{}
	for path, item := range doc.Paths {
		for method, op := range item {
			k := strings.ToUpper(method) + " " + path
			out = append(out, k)
			ops[k] = op
		}
	}
	slices.Sort(out)
	return out, ops
}

// The served OpenAPI document describes exactly the routes registered,
// with their methods, and the embedded file describes every one of them.
func TestOpenAPIMatchesTheRoutes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, err := web.New(e.cfg)
	require.NoError(t, err)
	routes := h.Patterns()
	slices.Sort(routes)
	require.Contains(t, routes, "POST /batches/{id}/requeue")

	// No token needed.
	r := e.do(http.MethodGet, "/api/v1/openapi.json", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "application/json; charset=utf-8", r.header.Get("Content-Type"))
	served, ops := operations(t, r.body)
	require.Equal(t, routes, served, "the served document's operations are the registered routes")

	// The file itself: every route registered is described there, and
	// nothing else (the served document would otherwise fill a gap with a
	// bare operation, or drop one).
	raw, err := os.ReadFile("openapi.json")
	require.NoError(t, err)
	file, fileOps := operations(t, raw)
	require.Equal(t, routes, file, "openapi.json describes exactly the routes of New and ingest.Routes")
	for _, k := range served {
		require.Equal(t, fileOps[k], ops[k], "%s is served as described", k)
		require.NotEmpty(t, fileOps[k].(map[string]any)["summary"], "%s has a summary", k)
	}
	e.requireError(http.MethodPost, "/api/v1/openapi.json", "", nil, http.StatusUnauthorized, web.CodeUnauthorized, "")
	e.requireError(http.MethodPost, "/api/v1/openapi.json", readToken, nil, http.StatusMethodNotAllowed, web.CodeMethodNotAllowed, "")

	// A server without the batch routes does not offer them; a route of
	// its own configuration appears, undescribed.
	cfg := e.cfg
	cfg.Routes = []web.Route{{Pattern: "GET /custom", Role: web.RoleRead, Handle: func(w http.ResponseWriter, _ *http.Request) error {
		web.WriteJSON(w, http.StatusOK, struct{}{})
		return nil
	}}}
	h2, err := web.New(cfg)
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	h2.ServeHTTP(rec, httptest.NewRequestWithContext(e.ctx, http.MethodGet, "/api/v1/openapi.json", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	served2, _ := operations(t, rec.Body.Bytes())
	routes2 := h2.Patterns()
	slices.Sort(routes2)
	require.Equal(t, routes2, served2)
	require.Contains(t, served2, "GET /custom")
	require.NotContains(t, served2, "GET /batches")
}
