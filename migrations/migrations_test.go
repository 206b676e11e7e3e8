package migrations_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// setup gives the test a fresh, migrated database and a connection to it.
func setup(t *testing.T) (context.Context, *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	conn, err := pgx.Connect(ctx, pgtest.New(t))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return ctx, conn
}

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
	ctx, conn := setup(t)
	_, err := conn.Exec(ctx, `INSERT INTO stint_migration (version, name) VALUES (9999, 'future')`)
	require.NoError(t, err)
	require.ErrorContains(t, migrations.Up(ctx, conn), "upgrade stint")
}

// TestBookkeepingFromBeforeTheLines: a database whose stint_migration
// predates the migration lines (the ingest and replication tables were the
// core migrations 3 and 4) is brought to the lines without applying or
// reverting anything, and then goes down and up like any other.
func TestBookkeepingFromBeforeTheLines(t *testing.T) {
	t.Parallel()
	ctx, conn := setup(t)
	_, err := conn.Exec(ctx, `
		ALTER TABLE stint_migration DROP CONSTRAINT stint_migration_pkey;
		UPDATE stint_migration SET version = 3, name = 'ingest' WHERE line = 'ingest';
		UPDATE stint_migration SET version = 4, name = 'replication' WHERE line = 'replication';
		ALTER TABLE stint_migration DROP COLUMN line, ADD PRIMARY KEY (version)`)
	require.NoError(t, err)
	var before int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM stint_migration`).Scan(&before))

	list, err := migrations.List(ctx, conn)
	require.NoError(t, err)
	require.Len(t, list, before, "one row per migration, before and after")
	for _, s := range list {
		require.False(t, s.AppliedAt.IsZero(), "migration %s is pending after the bookkeeping moved", s)
	}
	require.NoError(t, migrations.Up(ctx, conn), "nothing to apply, nothing applied twice")

	all, err := migrations.All()
	require.NoError(t, err)
	for range all {
		require.NoError(t, migrations.Down(ctx, conn))
	}
	var left int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'stint\_%' AND tablename <> 'stint_migration'`).Scan(&left))
	require.Zero(t, left, "every table is gone after every migration went down")
	require.NoError(t, migrations.Up(ctx, conn))
}

// TestBehaviorLinesGrantTheNodeRole: the behavior lines run after the core
// line created the roles, and grant the node role their tables themselves.
func TestBehaviorLinesGrantTheNodeRole(t *testing.T) {
	t.Parallel()
	ctx, conn := setup(t)
	var roles bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node')`).Scan(&roles))
	if !roles {
		t.Skip("the test database's user cannot create roles")
	}
	for _, table := range []string{"stint_ingest_object", "stint_ingest_file", "stint_replication"} {
		var ok bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT has_table_privilege('stint_node', $1, 'SELECT, INSERT, UPDATE, DELETE')`, table).Scan(&ok))
		require.True(t, ok, "stint_node cannot write %s", table)
	}
}

// TestHotPathArraysUseLZ4 checks that the arrays written on every claim and
// finish (the lease's task ids, the change feed's columns) are compressed
// with lz4 where the server has it.
func TestHotPathArraysUseLZ4(t *testing.T) {
	t.Parallel()
	ctx, conn := setup(t)
	if _, err := conn.Exec(ctx, `SET default_toast_compression = lz4`); err != nil {
		t.Skipf("this server has no lz4: %v", err)
	}
	for _, c := range []struct{ table, column string }{
		{"stint_lease", "task_ids"},
		{"stint_change", "task_ids"}, {"stint_change", "behaviors"}, {"stint_change", "statuses"},
		{"stint_change", "parent_ids"}, {"stint_change", "finals"}, {"stint_change", "progresses"},
	} {
		var method string
		require.NoError(t, conn.QueryRow(ctx, `SELECT attcompression::text FROM pg_attribute
			WHERE attrelid = $1::regclass AND attname = $2`, c.table, c.column).Scan(&method))
		require.Equal(t, "l", method, "%s.%s is not compressed with lz4", c.table, c.column)
	}
}

// TestAMigrationBlockedByALockStallsNoOne checks that a migration whose
// ALTER TABLE waits for a lock that a long transaction holds gives up its
// place in the lock queue within the lock wait, so that the statements of
// others on that table (which queue behind it) go on, and that it is
// applied once the transaction ended.
func TestAMigrationBlockedByALockStallsNoOne(t *testing.T) {
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
	migrator, blocker, other := connect(), connect(), connect()
	// Revert down to the core line's 0023, whose first statement alters
	// stint_task.
	for {
		list, err := migrations.List(ctx, migrator)
		require.NoError(t, err)
		i := slices.IndexFunc(list, func(s migrations.Status) bool {
			return s.Line == migrations.CoreLine && s.Version == 23
		})
		require.GreaterOrEqual(t, i, 0)
		if list[i].AppliedAt.IsZero() {
			break
		}
		require.NoError(t, migrations.Down(ctx, migrator))
	}
	// A long transaction reads stint_task.
	tx, err := blocker.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, `SELECT count(*) FROM stint_task`)
	require.NoError(t, err)

	migrated := make(chan error, 1)
	go func() { migrated <- migrations.Up(ctx, migrator) }()
	// Once the migration waits for its lock, another session's read of
	// the table queues behind it, and must get through while the long
	// transaction still runs.
	require.Eventually(t, func() bool {
		var waiting bool
		err := other.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE relation = 'stint_task'::regclass AND mode = 'AccessExclusiveLock' AND NOT granted)`).Scan(&waiting)
		return err == nil && waiting
	}, 30*time.Second, 10*time.Millisecond, "the migration should wait for the long transaction's lock")
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	_, err = other.Exec(rctx, `SELECT count(*) FROM stint_task`)
	require.NoError(t, err, "a read of the table stayed queued behind the migration for as long as the long transaction ran")
	select {
	case err := <-migrated:
		require.Failf(t, "the migration ended while the lock was held", "err: %v", err)
	default:
	}
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-migrated)
	list, err := migrations.List(ctx, migrator)
	require.NoError(t, err)
	for _, s := range list {
		require.False(t, s.AppliedAt.IsZero(), "%s applied", s.Migration)
	}
}
