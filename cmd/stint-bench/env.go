package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/internal/pgcluster"
)

// dbServer is the PostgreSQL server the benchmark runs on. It hands out a
// fresh database per scenario and system.
type dbServer struct {
	admin   string             // DSN of the maintenance database
	source  string             // how the server came to be, for the report
	cluster *pgcluster.Cluster // the throwaway cluster, or nil with --db
	dataDir string             // the throwaway cluster's directory, removed by close

	// create, when set, replaces CREATE DATABASE (tests use pgtest.New).
	create func(ctx context.Context, label string) (string, error)

	mu      sync.Mutex
	token   string
	counter int
	drops   []string // databases created and not yet dropped
}

// openServer starts the throwaway cluster or connects to --db.
func openServer(ctx context.Context, cfg config, stderr io.Writer) (*dbServer, error) {
	token, err := randomToken()
	if err != nil {
		return nil, err
	}
	if cfg.dbURL != "" {
		conn, err := pgx.Connect(ctx, cfg.dbURL)
		if err != nil {
			return nil, fmt.Errorf("connect to --db: %w", err)
		}
		_ = conn.Close(ctx)
		return &dbServer{admin: cfg.dbURL, source: "existing server (--db)", token: token}, nil
	}
	dir, err := os.MkdirTemp(cfg.dataDir, "stint-bench-")
	if err != nil {
		return nil, fmt.Errorf("create the cluster's directory: %w", err)
	}
	mode := "durable: fsync, synchronous_commit and full_page_writes on"
	if cfg.fast {
		mode = "--fast: fsync, synchronous_commit and full_page_writes off"
	}
	if cfg.verbose {
		fmt.Fprintf(stderr, "stint-bench: starting a PostgreSQL cluster in %s (%s)\n", dir, mode)
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: dir, Fast: cfg.fast})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start a PostgreSQL cluster: %w", err)
	}
	return &dbServer{
		admin:   c.DSN("postgres"),
		source:  fmt.Sprintf("throwaway cluster in %s on %s (%s)", dir, fsType(cfg.dataDir), mode),
		cluster: c,
		dataDir: dir,
		token:   token,
	}, nil
}

// newDB creates a fresh database for one run and returns its DSN. label
// names it for humans.
func (s *dbServer) newDB(ctx context.Context, label string) (string, error) {
	if s.create != nil {
		return s.create(ctx, label)
	}
	s.mu.Lock()
	s.counter++
	name := fmt.Sprintf("stintbench_%s_%s_%d", s.token, sanitize(label), s.counter)
	s.mu.Unlock()
	if err := s.adminExec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	s.mu.Lock()
	s.drops = append(s.drops, name)
	s.mu.Unlock()
	return pgcluster.WithDatabase(s.admin, name), nil
}

// dropDBs drops the databases newDB created.
func (s *dbServer) dropDBs(ctx context.Context) error {
	s.mu.Lock()
	names := s.drops
	s.drops = nil
	s.mu.Unlock()
	for _, name := range names {
		if err := s.adminExec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
	}
	return nil
}

// close drops the databases and stops the throwaway cluster.
func (s *dbServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if s.cluster == nil {
		if err := s.dropDBs(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "stint-bench:", err)
		}
		return
	}
	if err := s.cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stint-bench: stop the cluster:", err)
		return
	}
	if err := os.RemoveAll(s.dataDir); err != nil {
		fmt.Fprintln(os.Stderr, "stint-bench: remove the cluster's directory:", err)
	}
}

func (s *dbServer) adminExec(ctx context.Context, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, s.admin)
	if err != nil {
		return fmt.Errorf("connect to the maintenance database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// Settings are the PostgreSQL settings the benchmark ran with.
type Settings struct {
	Source            string `json:"source"`
	Version           string `json:"version"`
	Fsync             string `json:"fsync"`
	SynchronousCommit string `json:"synchronous_commit"`
	FullPageWrites    string `json:"full_page_writes"`
	SharedBuffers     string `json:"shared_buffers"`
	MaxConnections    string `json:"max_connections"`
	WalLevel          string `json:"wal_level"`
	CPUs              int    `json:"cpus"`
}

// settings reads the server's settings.
func (s *dbServer) settings(ctx context.Context) (Settings, error) {
	conn, err := pgx.Connect(ctx, s.admin)
	if err != nil {
		return Settings{}, fmt.Errorf("read settings: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st := Settings{Source: s.source}
	for name, dst := range map[string]*string{"server_version": &st.Version, "fsync": &st.Fsync,
		"synchronous_commit": &st.SynchronousCommit, "full_page_writes": &st.FullPageWrites,
		"shared_buffers": &st.SharedBuffers, "max_connections": &st.MaxConnections, "wal_level": &st.WalLevel} {
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(dst); err != nil {
			return Settings{}, fmt.Errorf("read setting %s: %w", name, err)
		}
	}
	return st, nil
}

// enableStatements makes pg_stat_statements available, restarting the
// throwaway cluster with the library preloaded if needed. It returns false
// with a reason when it cannot (an existing server without the library).
func (s *dbServer) enableStatements(ctx context.Context) (bool, string, error) {
	loaded := func() (bool, error) {
		conn, err := pgx.Connect(ctx, s.admin)
		if err != nil {
			return false, fmt.Errorf("connect to the maintenance database: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var libs string
		if err := conn.QueryRow(ctx, "SELECT current_setting('shared_preload_libraries')").Scan(&libs); err != nil {
			return false, fmt.Errorf("read shared_preload_libraries: %w", err)
		}
		return strings.Contains(libs, "pg_stat_statements"), nil
	}
	ok, err := loaded()
	if err != nil {
		return false, "", err
	}
	if !ok {
		if s.cluster == nil {
			return false, "pg_stat_statements is not in shared_preload_libraries of the --db server", nil
		}
		if err := s.adminExec(ctx, "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"); err != nil {
			return false, "", fmt.Errorf("preload pg_stat_statements: %w", err)
		}
		if err := s.cluster.Restart(ctx); err != nil {
			return false, "", fmt.Errorf("restart the cluster with pg_stat_statements: %w", err)
		}
	}
	if err := s.adminExec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return false, "", fmt.Errorf("create extension pg_stat_statements: %w", err)
	}
	return true, "", nil
}

// dbName returns the database a DSN names.
func dbName(dsn string) (string, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "", fmt.Errorf("parse DSN: %w", err)
	}
	return cfg.Database, nil
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

func randomToken() (string, error) {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// fsType names the file system dir is on ("tmpfs" matters: fsync is free
// there).
func fsType(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "unknown file system"
	}
	switch st.Type {
	case 0x01021994:
		return "tmpfs (memory: fsync costs nothing)"
	case 0xEF53:
		return "ext4"
	case 0x58465342:
		return "xfs"
	case 0x9123683E:
		return "btrfs"
	case 0x794c7630:
		return "overlayfs"
	}
	return fmt.Sprintf("file system 0x%x", st.Type)
}
