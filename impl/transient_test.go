package impl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

func TestTransient(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{api.ErrNotFound, false},
		{fmt.Errorf("get: %w", context.Canceled), false},
		{context.DeadlineExceeded, false},
		{api.Invalid("id", "bad"), false},
		{&pgconn.PgError{Code: "42501"}, false}, // insufficient privilege
		{&pgconn.PgError{Code: "57014"}, false}, // query canceled
		{&pgconn.PgError{Code: "57P01"}, true},  // admin shutdown: terminated backend
		{&pgconn.PgError{Code: "57P03"}, true},  // cannot connect now
		{&pgconn.PgError{Code: "08006"}, true},  // connection failure
		{&pgconn.PgError{Code: "40001"}, true},  // serialization failure
		{fmt.Errorf("get task: %w", io.ErrUnexpectedEOF), true},
		{errors.New("conn closed"), true},
	} {
		require.Equal(t, tc.want, transient(tc.err), "%v", tc.err)
	}
}
