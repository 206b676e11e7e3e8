package postgres_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/store/postgres"
)

func TestOpenRefusesAnEmptyURL(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{"", "  "} {
		st, err := postgres.Open(context.Background(), dsn)
		require.Nil(t, st)
		require.EqualError(t, err, "open store: the database URL is empty: want postgres://user@host/db or key=value settings")
	}
}
