package migrations_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestDownUpAndConcurrentUp(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := pgtest.New(t)
	connect := func() *pgx.Conn {
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	conn := connect()
	all, err := migrations.All()
	require.NoError(t, err)
	require.NotEmpty(t, all)

	// The template is fully migrated: walk every migration down.
	for range all {
		require.NoError(t, migrations.Down(ctx, conn))
	}
	list, err := migrations.List(ctx, conn)
	require.NoError(t, err)
	for _, s := range list {
		require.True(t, s.AppliedAt.IsZero(), "migration %d still applied", s.Version)
	}
	var exists bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass('stint_task') IS NOT NULL`).Scan(&exists))
	require.False(t, exists)

	// Many starters at once migrate exactly once.
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range errs {
		c := connect()
		wg.Go(func() { errs[i] = migrations.Up(ctx, c) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	list, err = migrations.List(ctx, conn)
	require.NoError(t, err)
	require.Len(t, list, len(all))
	for _, s := range list {
		require.False(t, s.AppliedAt.IsZero(), "migration %d not applied", s.Version)
	}
	require.NoError(t, migrations.Down(ctx, conn))
	require.NoError(t, migrations.Up(ctx, conn), "down then up again works")
}

func TestUnknownAppliedVersionIsRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.New(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `INSERT INTO stint_migration (version, name) VALUES (9999, 'future')`)
	require.NoError(t, err)
	require.ErrorContains(t, migrations.Up(ctx, conn), "upgrade stint")
}
