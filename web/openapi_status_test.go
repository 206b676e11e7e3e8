package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/web"
)

// declaredStatuses returns the statuses openapi.json declares for each
// operation, by "METHOD /path".
func declaredStatuses(t *testing.T) map[string][]int {
	t.Helper()
	raw, err := os.ReadFile("openapi.json")
	require.NoError(t, err)
	var doc struct {
		Paths map[string]map[string]struct {
			Responses map[string]json.RawMessage `json:"responses"`
		} `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	out := map[string][]int{}
	for path, item := range doc.Paths {
		for method, op := range item {
			k := strings.ToUpper(method) + " " + path
			for code := range op.Responses {
				n, err := strconv.Atoi(code)
				require.NoError(t, err, "%s declares %q: statuses are declared one by one", k, code)
				out[k] = append(out[k], n)
			}
		}
	}
	return out
}

// Every status a route answers is declared for it in openapi.json. Each
// route gets the requests that reach its every check: no token, a token
// too weak, an unknown query parameter, an id well formed and unknown or
// malformed, and no body, an empty object, malformed JSON, a body of
// another Content-Type and one over the size limit; every status seen must
// be declared. The statuses no request can provoke here are required by
// rule: 500 everywhere (a database failure) and 503 for the event stream
// (at its limit of streams).
func TestOpenAPIDeclaresEveryStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, err := web.New(e.cfg)
	require.NoError(t, err)
	declared := declaredStatuses(t)

	big := `{"reason":"` + strings.Repeat("a", 2<<20) + `"}`
	bodies := []struct{ name, contentType, body string }{
		{"no body", "", ""},
		{"{}", "application/json", "{}"},
		{"malformed JSON", "application/json", "{"},
		{"text/plain", "text/plain", "{}"},
		{"over the size limit", "application/json", big},
	}
	send := func(method, path, token, contentType, body string) int {
		ctx, cancel := context.WithCancel(e.ctx)
		defer cancel() // ends an event stream once its status is in
		var r io.Reader
		if body != "" {
			r = strings.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, e.ts.URL+"/api/v1"+path, r)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp, err := e.ts.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}

	var missing []string
	for _, pattern := range h.Patterns() {
		method, path, _ := strings.Cut(pattern, " ")
		seen := map[int]string{}
		see := func(status int, probe string) {
			if _, ok := seen[status]; !ok {
				seen[status] = probe
			}
		}
		see(http.StatusInternalServerError, "the rule: any request may meet a database failure")
		if pattern == "GET /events" {
			see(http.StatusServiceUnavailable, "the rule: the event streams are at their limit")
		}
		if pattern == "GET /openapi.json" {
			seen = map[int]string{} // served from memory, to anyone
		}
		for _, id := range []string{"unknown-id", strings.Repeat("x", 200)} {
			p := strings.NewReplacer("{id}", id, "{key}", id, "{name}", "node", "{topic}", "topic").Replace(path)
			see(send(method, p, "", "", ""), "no token")
			see(send(method, p, readToken, "", ""), "a read token")
			for _, query := range []string{"", "?bogus=1"} {
				for _, b := range bodies {
					if method == http.MethodGet && b.body != "" {
						continue
					}
					see(send(method, p+query, adminToken, b.contentType, b.body), fmt.Sprintf("%s%s with %s", p, query, b.name))
				}
			}
		}
		for status, probe := range seen {
			if !slices.Contains(declared[pattern], status) {
				missing = append(missing, fmt.Sprintf("%s answers %d (%s)", pattern, status, probe))
			}
		}
	}
	slices.Sort(missing)
	require.Empty(t, missing, "statuses openapi.json does not declare")
}
