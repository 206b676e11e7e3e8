package web

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// openAPIDocument is the OpenAPI 3 description of the API, served at
// GET /api/v1/openapi.json. It describes every endpoint of New and of
// ingest.Routes; a test checks it against the routes registered.
//
//go:embed openapi.json
var openAPIDocument []byte

// openAPIPath is where the document is served, relative to apiPrefix.
const openAPIPath = "/openapi.json"

// Patterns returns the API's endpoints as "METHOD /path" relative to
// /api/v1, in the syntax of net/http.ServeMux patterns (and of OpenAPI
// paths): what the OpenAPI document describes.
func (h *Handler) Patterns() []string {
	return slices.Clone(h.patterns)
}

// buildOpenAPI returns the document served for the registered patterns:
// the embedded document's operations of those patterns (so that a server
// without the batch routes does not offer them), and a bare operation for
// each route of Config.Routes the document does not know.
func buildOpenAPI(patterns []string) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		return nil, fmt.Errorf("decode the OpenAPI document: %w", err)
	}
	known, _ := doc["paths"].(map[string]any)
	paths := map[string]any{}
	for _, p := range patterns {
		method, path, _ := strings.Cut(p, " ")
		method = strings.ToLower(method)
		item, _ := paths[path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[path] = item
		}
		if ops, ok := known[path].(map[string]any); ok && ops[method] != nil {
			item[method] = ops[method]
			continue
		}
		item[method] = map[string]any{
			"summary":   "An endpoint added by the server's configuration; it is not described here.",
			"responses": map[string]any{"default": map[string]any{"description": "See the server's documentation."}},
		}
	}
	doc["paths"] = paths
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode the OpenAPI document: %w", err)
	}
	return out, nil
}

// serveOpenAPI serves the document. It needs no token: it describes the
// API, which is no secret, and tools fetch it before they have one.
func (h *Handler) serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(h.openAPI)
}
