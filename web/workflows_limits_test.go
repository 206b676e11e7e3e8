package web_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/web"
)

// A workflow that does not exist is named as a workflow in every 404 of
// the workflow endpoints.
func TestWorkflowNotFoundSaysWorkflow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/api/v1/workflows/nope-nope"},
		{http.MethodDelete, "/api/v1/workflows/nope-nope"},
		{http.MethodPost, "/api/v1/workflows/nope-nope/cancel"},
		{http.MethodPost, "/api/v1/workflows/nope-nope/retry"},
		{http.MethodPost, "/api/v1/workflows/nope-nope/hold"},
		{http.MethodPost, "/api/v1/workflows/nope-nope/release"},
	} {
		ae := e.requireError(c.method, c.path, adminToken, nil, http.StatusNotFound, web.CodeNotFound, "")
		require.Equal(t, "workflow nope-nope not found", ae.Error.Message, "%s %s", c.method, c.path)
	}
}

// A workflow submit may be far larger than other bodies: one of 20,000
// small nodes is stored over HTTP. A body over a limit is a 413 that names
// the limit.
func TestWorkflowBodyLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 20_000
	var b bytes.Buffer
	b.WriteString(`{"id":"wf-wide","nodes":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"node-%05d","task":{"behavior":%q,"params":{"note":"a node of a wide workflow"}}}`, i, idleKind.ID)
	}
	b.WriteString(`]}`)
	require.Greater(t, b.Len(), web.MaxBody, "the body is over the limit of other requests")
	var sub api.WorkflowSubmission
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, b.Bytes(), http.StatusCreated, &sub)
	require.Len(t, sub.Nodes, n)

	over := []byte(`{"nodes":[` + strings.Repeat(" ", web.MaxWorkflowBody) + `]}`)
	ae := e.requireError(http.MethodPost, "/api/v1/workflows", submitToken, over, http.StatusRequestEntityTooLarge, web.CodeInvalid, "body")
	require.Equal(t, "invalid body: over the limit of 32 MiB (33554432 bytes) of POST /api/v1/workflows", ae.Error.Message)
	ae = e.requireError(http.MethodPost, "/api/v1/tasks", submitToken, b.Bytes(), http.StatusRequestEntityTooLarge, web.CodeInvalid, "body")
	require.Equal(t, "invalid body: over the limit of 1088 KiB (1114112 bytes) of POST /api/v1/tasks", ae.Error.Message)
}
