// Package migrations holds stint's versioned SQL schema and applies it.
//
// Each migration is a pair of files NNNN_name.up.sql and NNNN_name.down.sql,
// embedded in the binary. Up and Down hold a session advisory lock while they
// work, so any number of nodes may start at once and the schema is migrated
// exactly once. Each migration runs in its own transaction together with the
// row that records it in stint_migration.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed *.sql
var files embed.FS

// lockKey is the advisory lock key that serializes migrators ("stint" in ASCII).
const lockKey = 0x7374696e74

// Migration is one versioned schema change.
type Migration struct {
	// Version orders migrations; it is the number in front of the file name.
	Version int
	// Name is the file name's middle part, e.g. "tasks".
	Name string
	up   string
	down string
}

// Status is a migration and whether it is applied.
type Status struct {
	Migration
	// AppliedAt is when it was applied; zero when it is pending.
	AppliedAt time.Time
}

// All returns the embedded migrations in version order.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		name := e.Name()
		base, dir, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), ".")
		if !ok || (dir != "up" && dir != "down") {
			return nil, fmt.Errorf("migration file %q: want NNNN_name.up.sql or NNNN_name.down.sql", name)
		}
		num, label, _ := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("migration file %q: bad version: %w", name, err)
		}
		body, err := fs.ReadFile(files, path.Clean(name))
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", name, err)
		}
		m := byVersion[v]
		if m == nil {
			m = &Migration{Version: v, Name: label}
			byVersion[v] = m
		}
		if dir == "up" {
			m.up = string(body)
		} else {
			m.down = string(body)
		}
	}
	all := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.up == "" || m.down == "" {
			return nil, fmt.Errorf("migration %04d_%s: needs both an up and a down file", m.Version, m.Name)
		}
		all = append(all, *m)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Version < all[j].Version })
	return all, nil
}

// Up applies every pending migration. It is safe to call from many
// processes at once.
func Up(ctx context.Context, conn *pgx.Conn) error {
	return locked(ctx, conn, func(applied map[int]time.Time, all []Migration) error {
		for _, m := range all {
			if _, ok := applied[m.Version]; ok {
				continue
			}
			if err := apply(ctx, conn, m.up,
				`INSERT INTO stint_migration (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return fmt.Errorf("migrate up %04d_%s: %w", m.Version, m.Name, err)
			}
		}
		return nil
	})
}

// Down reverts the newest applied migration, or does nothing when none is
// applied.
func Down(ctx context.Context, conn *pgx.Conn) error {
	return locked(ctx, conn, func(applied map[int]time.Time, all []Migration) error {
		for i := len(all) - 1; i >= 0; i-- {
			m := all[i]
			if _, ok := applied[m.Version]; !ok {
				continue
			}
			if err := apply(ctx, conn, m.down,
				`DELETE FROM stint_migration WHERE version = $1`, m.Version); err != nil {
				return fmt.Errorf("migrate down %04d_%s: %w", m.Version, m.Name, err)
			}
			return nil
		}
		return nil
	})
}

// List returns every embedded migration with the time it was applied.
func List(ctx context.Context, conn *pgx.Conn) ([]Status, error) {
	var out []Status
	err := locked(ctx, conn, func(applied map[int]time.Time, all []Migration) error {
		for _, m := range all {
			out = append(out, Status{Migration: m, AppliedAt: applied[m.Version]})
		}
		return nil
	})
	return out, err
}

func apply(ctx context.Context, conn *pgx.Conn, body, record string, args ...any) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, body); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, record, args...)
		return err
	})
}

// locked runs fn while holding the migration advisory lock, with the applied
// versions read under that lock.
func locked(ctx context.Context, conn *pgx.Conn, fn func(applied map[int]time.Time, all []Migration) error) (err error) {
	all, err := All()
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(lockKey)); err != nil {
		return fmt.Errorf("take migration lock: %w", err)
	}
	defer func() {
		// A fresh context: the unlock must happen even when ctx is done.
		_, uerr := conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, int64(lockKey))
		if uerr != nil && err == nil {
			err = fmt.Errorf("release migration lock: %w", uerr)
		}
	}()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS stint_migration (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("create stint_migration: %w", err)
	}
	rows, err := conn.Query(ctx, `SELECT version, applied_at FROM stint_migration`)
	if err != nil {
		return fmt.Errorf("read applied migrations: %w", err)
	}
	applied := map[int]time.Time{}
	var v int
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&v, &at}, func() error { applied[v] = at; return nil }); err != nil {
		return fmt.Errorf("read applied migrations: %w", err)
	}
	for ver := range applied {
		if !known(all, ver) {
			return errors.New("database has migration " + strconv.Itoa(ver) + " that this binary does not know: upgrade stint")
		}
	}
	return fn(applied, all)
}

func known(all []Migration, v int) bool {
	for _, m := range all {
		if m.Version == v {
			return true
		}
	}
	return false
}
