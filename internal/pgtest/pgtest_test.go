package pgtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { Main(m) }

// connect opens a connection to dsn that is closed when the test ends.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// requireMigrated checks that the database behind conn holds stint's schema.
func requireMigrated(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	var migrated bool
	require.NoError(t, conn.QueryRow(context.Background(),
		"SELECT to_regclass('stint_migration') IS NOT NULL").Scan(&migrated))
	require.True(t, migrated, "the database should hold the migrated schema")
}

// databaseExists reports whether database name exists on the test server.
func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	conn := connect(t, AdminDSN())
	var exists bool
	require.NoError(t, conn.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists))
	return exists
}

func TestParallelTestsGetSeparateMigratedDatabases(t *testing.T) {
	ctx := context.Background()
	var (
		mu    sync.Mutex
		names = map[string]bool{}
	)
	// Each subtest writes a row that the others must not see. The group returns once both have ended.
	t.Run("group", func(t *testing.T) {
		for _, sub := range []string{"first", "second"} {
			t.Run(sub, func(t *testing.T) {
				t.Parallel()
				conn := connect(t, New(t))
				requireMigrated(t, conn)

				var name string
				require.NoError(t, conn.QueryRow(ctx, "SELECT current_database()").Scan(&name))
				mu.Lock()
				require.False(t, names[name], "database %s was handed out twice", name)
				names[name] = true
				mu.Unlock()

				_, err := conn.Exec(ctx, "CREATE TABLE scratch (v text)")
				require.NoError(t, err, "the table should not exist yet: writes must not leak between databases")
				_, err = conn.Exec(ctx, "INSERT INTO scratch VALUES ($1)", sub)
				require.NoError(t, err)
				var rows []string
				r, err := conn.Query(ctx, "SELECT v FROM scratch")
				require.NoError(t, err)
				rows, err = pgx.CollectRows(r, pgx.RowTo[string])
				require.NoError(t, err)
				require.Equal(t, []string{sub}, rows)
			})
		}
	})
	require.Len(t, names, 2)
	// The subtests' cleanups have dropped their databases.
	for name := range names {
		require.False(t, databaseExists(t, name), "database %s should be dropped when its test ends", name)
	}
}

func TestWritesInOneDatabaseAreInvisibleInAnother(t *testing.T) {
	ctx := context.Background()
	a, b := connect(t, New(t)), connect(t, New(t))
	requireMigrated(t, a)
	requireMigrated(t, b)
	_, err := a.Exec(ctx, "CREATE TABLE only_in_a (id int)")
	require.NoError(t, err)
	var inB bool
	require.NoError(t, b.QueryRow(ctx, "SELECT to_regclass('only_in_a') IS NOT NULL").Scan(&inB))
	require.False(t, inB)
}

func TestRestartKeepsDatabases(t *testing.T) {
	dsn := New(t)
	c := Cluster()
	if c == nil {
		t.Skip("the server comes from " + EnvDatabaseURL + ", so this binary cannot restart it")
	}
	ctx := context.Background()
	conn := connect(t, dsn)
	_, err := conn.Exec(ctx, "CREATE TABLE kept (id int); INSERT INTO kept VALUES (42)")
	require.NoError(t, err)

	require.NoError(t, c.Restart(ctx))
	require.Error(t, conn.Ping(ctx), "a connection from before the restart should be broken")

	var id int
	require.NoError(t, connect(t, dsn).QueryRow(ctx, "SELECT id FROM kept").Scan(&id))
	require.Equal(t, 42, id)
	// New still works after a restart.
	requireMigrated(t, connect(t, New(t)))
}
