package web

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// A tail route of two wildcards ends the first at the first place where
// the literal segments between them let the rest match; a %2F is never a
// separator; of one prefix's routes, one of more wildcards wins over an
// action's.
func TestTailRoutesOfTwoWildcards(t *testing.T) {
	t.Parallel()
	tails := &tailRoutes{method: http.MethodPost, prefix: "/api/v1/tasks/"}
	for _, pattern := range []string{"/tasks/{id}/retry", "/tasks/{id}/signals/{topic}"} {
		prefix, rt, ok := splitTailPattern(pattern)
		require.True(t, ok, pattern)
		require.Equal(t, "/tasks/", prefix)
		require.NoError(t, tails.add(rt))
	}
	_, rt, _ := splitTailPattern("/tasks/{key}/signals/{name}")
	require.ErrorContains(t, tails.add(rt), "conflicts with /api/v1/tasks/{id}/signals/{topic}")
	for _, c := range []struct {
		path   string
		values []string // nil: no route
	}{
		{"/api/v1/tasks/a/signals/t", []string{"a", "t"}},
		{"/api/v1/tasks/a/b/signals/c/d", []string{"a/b", "c/d"}},
		{"/api/v1/tasks/a/signals/b/signals/c", []string{"a", "b/signals/c"}},
		{"/api/v1/tasks/a%2Fsignals/b/signals/c", []string{"a/signals/b", "c"}},
		{"/api/v1/tasks/a/signals/retry", []string{"a", "retry"}},
		{"/api/v1/tasks/a/b/retry", []string{"a/b"}},
		{"/api/v1/tasks/signals/signals/t", []string{"signals", "t"}},
		{"/api/v1/tasks/a/signals/", nil},
		{"/api/v1/tasks//signals/t", nil},
		{"/api/v1/tasks/a/signals/t/", nil},
		{"/api/v1/tasks/a/signals", nil},
	} {
		_, values, ok := tails.match(httptest.NewRequest(http.MethodPost, c.path, nil))
		require.Equal(t, c.values != nil, ok, c.path)
		require.Equal(t, c.values, values, c.path)
	}
	for _, bad := range []string{"/tasks/{id}{topic}", "/tasks/{id}/x{topic}", "/tasks/{id}//{topic}", "/tasks/{id...}", "/tasks/x{id}"} {
		_, _, ok := splitTailPattern(bad)
		require.False(t, ok, bad)
	}
}
