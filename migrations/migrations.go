// Package migrations holds stint's versioned SQL schema and applies it.
//
// The schema comes in lines: the engine's own (CoreLine: the tasks, the
// leases, the change feed, the roles), and one line per built-in behavior
// that keeps tables of its own (ingest, replication). Each line numbers its
// migrations from 1, so that the engine's schema is the engine's alone and
// a behavior's tables change without renumbering anything else. Each
// migration is a pair of files NNNN_name.up.sql and NNNN_name.down.sql,
// embedded in the binary: the core line's in this directory, a behavior
// line's in the subdirectory named for it.
//
// Each migration runs in its own transaction together with the row that
// records it in stint_migration, and each such transaction holds a
// transaction-scoped advisory lock, so any number of nodes may start at
// once and the schema is migrated exactly once. A migration whose
// statement waits for a table lock that another transaction holds gives
// up its place in the lock queue after a few seconds and is tried again,
// so that a deploy behind a long transaction does not stall every
// statement on that table until it ends.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stinthq/stint/internal/faultpoint"
)

//go:embed *.sql ingest/*.sql replication/*.sql
var files embed.FS

// lockKey is the advisory lock key that serializes migrators ("stint" in ASCII).
const lockKey = 0x7374696e74

// CoreLine is the name of the engine's own line of migrations.
const CoreLine = "stint"

// behaviorLines are the lines of the built-in behaviors, in the order Up
// applies them (after the core line), each a subdirectory.
var behaviorLines = []string{"ingest", "replication"}

// Migration is one versioned schema change.
type Migration struct {
	// Line is the line the migration belongs to: CoreLine or a behavior's
	// name.
	Line string
	// Version orders the migrations of a line; it is the number in front
	// of the file name.
	Version int
	// Name is the file name's middle part, e.g. "tasks".
	Name string
	up   string
	down string
}

// String names a migration as its files do, e.g. "0001_tasks", with the
// line in front unless it is the core line: "ingest/0001_inventory".
func (m Migration) String() string {
	name := fmt.Sprintf("%04d_%s", m.Version, m.Name)
	if m.Line != CoreLine {
		name = m.Line + "/" + name
	}
	return name
}

// key identifies a migration across lines.
type key struct {
	line    string
	version int
}

// Status is a migration and whether it is applied.
type Status struct {
	Migration
	// AppliedAt is when it was applied; zero when it is pending.
	AppliedAt time.Time
}

// All returns the embedded migrations in the order Up applies them: the
// core line, then each behavior line, each in version order.
func All() ([]Migration, error) {
	var all []Migration
	for _, line := range append([]string{CoreLine}, behaviorLines...) {
		dir := "."
		if line != CoreLine {
			dir = line
		}
		ms, err := readLine(line, dir)
		if err != nil {
			return nil, err
		}
		all = append(all, ms...)
	}
	return all, nil
}

// readLine reads the migrations of one line from dir.
func readLine(line, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(files, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations of line %s: %w", line, err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		name := e.Name()
		base, direction, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), ".")
		if !ok || (direction != "up" && direction != "down") {
			return nil, fmt.Errorf("migration file %q: want NNNN_name.up.sql or NNNN_name.down.sql", name)
		}
		num, label, _ := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("migration file %q: bad version %q", name, num)
		}
		body, err := fs.ReadFile(files, path.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", name, err)
		}
		m := byVersion[v]
		if m == nil {
			m = &Migration{Line: line, Version: v, Name: label}
			byVersion[v] = m
		}
		if direction == "up" {
			m.up = string(body)
		} else {
			m.down = string(body)
		}
	}
	ms := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.up == "" || m.down == "" {
			return nil, fmt.Errorf("migration %s: needs both an up and a down file", m)
		}
		ms = append(ms, *m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

// Up applies every pending migration, line by line in the order of All.
// It is safe to call from many processes at once.
func Up(ctx context.Context, conn *pgx.Conn) error {
	return upWhere(ctx, conn, func(Migration) bool { return true })
}

// upWhere applies the pending migrations that want selects, in the order
// of All, each in a transaction of its own.
func upWhere(ctx context.Context, conn *pgx.Conn, want func(Migration) bool) error {
	for {
		done := false
		err := locked(ctx, conn, func(tx pgx.Tx, applied map[key]time.Time, all []Migration) error {
			i := slices.IndexFunc(all, func(m Migration) bool {
				_, ok := applied[key{m.Line, m.Version}]
				return !ok && want(m)
			})
			if i < 0 {
				done = true
				return nil
			}
			m := all[i]
			if err := apply(ctx, tx, m.up,
				`INSERT INTO stint_migration (line, version, name) VALUES ($1, $2, $3)`, m.Line, m.Version, m.Name); err != nil {
				return fmt.Errorf("migrate up %s: %w", m, err)
			}
			return nil
		})
		if err != nil || done {
			return err
		}
	}
}

// Down reverts the newest applied migration (the one applied last, of
// any line), or does nothing when none is applied.
func Down(ctx context.Context, conn *pgx.Conn) error {
	return locked(ctx, conn, func(tx pgx.Tx, applied map[key]time.Time, all []Migration) error {
		newest := -1
		for i, m := range all {
			at, ok := applied[key{m.Line, m.Version}]
			if ok && (newest < 0 || !at.Before(applied[key{all[newest].Line, all[newest].Version}])) {
				newest = i
			}
		}
		if newest < 0 {
			return nil
		}
		m := all[newest]
		if err := apply(ctx, tx, m.down,
			`DELETE FROM stint_migration WHERE line = $1 AND version = $2`, m.Line, m.Version); err != nil {
			return fmt.Errorf("migrate down %s: %w", m, err)
		}
		return nil
	})
}

// List returns every embedded migration, in the order of All, with the
// time it was applied.
func List(ctx context.Context, conn *pgx.Conn) ([]Status, error) {
	var out []Status
	err := locked(ctx, conn, func(_ pgx.Tx, applied map[key]time.Time, all []Migration) error {
		for _, m := range all {
			out = append(out, Status{Migration: m, AppliedAt: applied[key{m.Line, m.Version}]})
		}
		return nil
	})
	return out, err
}

// apply runs a migration's body and then record (with args) in tx.
func apply(ctx context.Context, tx pgx.Tx, body, record string, args ...any) error {
	if _, err := tx.Exec(ctx, body); err != nil {
		return err
	}
	faultpoint.Reach(faultpoint.Migrate)
	_, err := tx.Exec(ctx, record, args...)
	return err
}

// lockIdleTimeout is how long a migrator's transaction may idle between
// two statements before the server ends it (and, with it, its hold of the
// migration lock and of the tables its statements locked, which every
// node's statements may wait for): a migrator stopped inside one (SIGSTOP,
// a paused VM) stalls the others that long at most. A migration's
// statements may run as long as they need.
const lockIdleTimeout = 2 * time.Second

// lockWait is how long a migration's statement waits for a table lock
// (its lock_timeout) before its transaction gives up, to be tried again
// after lockRetry: a migration's ALTER TABLE queued behind a long
// transaction (a report, a behavior's own) would otherwise make every
// statement of every node on that table queue behind it for as long as
// that transaction lasts. Waiting for another migrator's advisory lock is
// not bounded: its migration may take as long as it needs.
const lockWait = 2 * time.Second

// lockNotAvailable is the SQLSTATE of a statement that waited its
// lock_timeout.
const lockNotAvailable = "55P03"

// lockRetry bounds the backoff between a migration's tries when its locks
// were not free; it starts at a tenth of a second and doubles.
const lockRetry = 5 * time.Second

// locked runs fn in a transaction that holds the migration advisory lock,
// with the applied migrations read under that lock. The lock is the
// transaction's, never the session's: a migrator stopped between two
// transactions holds nothing. A transaction whose statement waited
// lockWait for a table lock is rolled back and tried again, until ctx
// ends.
func locked(ctx context.Context, conn *pgx.Conn, fn func(tx pgx.Tx, applied map[key]time.Time, all []Migration) error) error {
	all, err := All()
	if err != nil {
		return err
	}
	backoff := 100 * time.Millisecond
	for {
		err := lockedOnce(ctx, conn, all, fn)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != lockNotAvailable {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %w)", err, context.Cause(ctx))
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, lockRetry)
	}
}

// lockedOnce is one try of locked.
func lockedOnce(ctx context.Context, conn *pgx.Conn, all []Migration, fn func(tx pgx.Tx, applied map[key]time.Time, all []Migration) error) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('idle_in_transaction_session_timeout', $1, true), pg_advisory_xact_lock($2)`,
			fmt.Sprint(lockIdleTimeout.Milliseconds()), int64(lockKey)); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		// Only now: the wait for another migrator is not bounded.
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, fmt.Sprint(lockWait.Milliseconds())); err != nil {
			return fmt.Errorf("set the migration's lock_timeout: %w", err)
		}
		if err := prepareBookkeeping(ctx, tx); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT line, version, applied_at FROM stint_migration`)
		if err != nil {
			return fmt.Errorf("read applied migrations: %w", err)
		}
		applied := map[key]time.Time{}
		var k key
		var at time.Time
		if _, err := pgx.ForEachRow(rows, []any{&k.line, &k.version, &at}, func() error { applied[k] = at; return nil }); err != nil {
			return fmt.Errorf("read applied migrations: %w", err)
		}
		for k := range applied {
			if !slices.ContainsFunc(all, func(m Migration) bool { return m.Line == k.line && m.Version == k.version }) {
				return errors.New("database has migration " + Migration{Line: k.line, Version: k.version, Name: "?"}.String() +
					" that this binary does not know: upgrade stint")
			}
		}
		return fn(tx, applied, all)
	})
}

// prepareBookkeeping creates stint_migration, or brings one from before
// the lines to them: there, the ingest and replication tables were the
// core line's migrations 3 and 4, and they become the first of their own
// lines.
func prepareBookkeeping(ctx context.Context, conn pgx.Tx) error {
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS stint_migration (
		line       text        NOT NULL DEFAULT 'stint',
		version    integer     NOT NULL,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
		PRIMARY KEY (line, version))`); err != nil {
		return fmt.Errorf("create stint_migration: %w", err)
	}
	var lined bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = 'stint_migration' AND column_name = 'line')`).Scan(&lined); err != nil {
		return fmt.Errorf("read stint_migration's columns: %w", err)
	}
	if lined {
		return nil
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `
			ALTER TABLE stint_migration DROP CONSTRAINT stint_migration_pkey,
			    ADD COLUMN line text NOT NULL DEFAULT 'stint',
			    ALTER COLUMN applied_at SET DEFAULT clock_timestamp();
			UPDATE stint_migration SET line = 'ingest', version = 1, name = 'inventory' WHERE version = 3 AND name = 'ingest';
			UPDATE stint_migration SET line = 'replication', version = 1, name = 'definitions' WHERE version = 4 AND name = 'replication';
			ALTER TABLE stint_migration ADD PRIMARY KEY (line, version)`)
		return err
	})
	if err != nil {
		return fmt.Errorf("bring stint_migration to migration lines: %w", err)
	}
	return nil
}
