package web

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

func TestErrorForAnUnavailableDatabase(t *testing.T) {
	t.Parallel()
	readOnly := errorFor(fmt.Errorf("submit: %w (read_only: ...): %w", api.ErrReadOnly, errors.New("SQLSTATE 25006")))
	require.Equal(t, http.StatusServiceUnavailable, readOnly.Status)
	require.Equal(t, CodeUnavailable, readOnly.Code)
	require.Contains(t, readOnly.Message, "accepts no writes")
	require.NotContains(t, readOnly.Message, "25006", "the database's error stays in the server's log")

	down := errorFor(fmt.Errorf("submit: %w (unreachable: ...): %w", api.ErrUnavailable, errors.New("dial tcp: refused")))
	require.Equal(t, http.StatusServiceUnavailable, down.Status)
	require.Equal(t, CodeUnavailable, down.Code)
	require.NotContains(t, down.Message, "refused")

	require.Equal(t, http.StatusInternalServerError, errorFor(errors.New("boom")).Status)
}
