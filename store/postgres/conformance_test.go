package postgres_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
	"github.com/stinthq/stint/store/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) store.Store {
		st, err := postgres.Open(context.Background(), pgtest.New(t))
		require.NoError(t, err)
		t.Cleanup(st.Close)
		return st
	})
}
