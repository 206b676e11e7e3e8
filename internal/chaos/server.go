package chaos

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgcluster"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store/postgres"
)

// Server starts a PostgreSQL server of the test's own, stopped when the
// test ends, with a database "stint", migrated: for a fault that must not
// touch the test binary's cluster (a failover, a restore).
func Server(t *testing.T, ctx context.Context) *pgcluster.Cluster {
	srv, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: pgtest.TempDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	CreateDatabase(t, ctx, srv.DSN("postgres"), srv.DSN("stint"))
	return srv
}

// CreateDatabase creates the database "stint" on the server of adminDSN
// and migrates it through dsn (which may name more hosts than that
// server, a failover's multi-host URL).
func CreateDatabase(t *testing.T, ctx context.Context, adminDSN, dsn string) {
	conn, err := pgx.Connect(ctx, adminDSN)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, `CREATE DATABASE stint`)
	require.NoError(t, err)
	st, err := postgres.Open(ctx, dsn, postgres.Migrate())
	require.NoError(t, err)
	st.Close()
}
