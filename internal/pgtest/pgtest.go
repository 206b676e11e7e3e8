// Package pgtest provides throwaway PostgreSQL databases for tests.
//
// Each test package's TestMain calls Main with its *testing.M, and each test that needs a
// database calls New, which returns the DSN of a fresh database cloned from a template that holds
// stint's migrated schema. The first call to New in a test binary starts the
// binary's own PostgreSQL cluster (in a temporary directory, on a free port on 127.0.0.1, with
// durability turned off for speed) and builds the template; Main stops the cluster and removes its
// directory after the tests have run. Start-up costs a second or two per test binary; each further
// database costs a few tens of milliseconds.
//
// If the environment variable STINT_TEST_DATABASE_URL is set, no cluster is started: the databases are
// created on that server instead, whose user must be allowed to create databases. The URL's database
// is used as the maintenance database. Test binaries running in parallel against one server each use
// their own template database, dropped by Main.
//
// Without STINT_TEST_DATABASE_URL and without installed PostgreSQL server binaries, Main installs them
// before the tests run (the distribution's postgresql package, as root on Debian or Ubuntu, once for all test
// binaries running at the same time; see package provision) and otherwise fails the test with a message
// that says how to install PostgreSQL.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/internal/pgcluster"
	"github.com/stinthq/stint/migrations"
)

// EnvDatabaseURL names the environment variable that points the tests at an existing PostgreSQL server
// instead of a cluster started by the test binary.
const EnvDatabaseURL = "STINT_TEST_DATABASE_URL"

// lockKey is the advisory lock, taken on the maintenance database of a shared server, that serializes
// CREATE DATABASE across test binaries ("pgtest" in ASCII).
const lockKey = 0x706774657374

// setupTimeout bounds starting the cluster and building the template.
const setupTimeout = 3 * time.Minute

// installTimeout bounds installing the PostgreSQL server binaries, which may first wait for other test
// binaries' installs.
const installTimeout = 15 * time.Minute

// opTimeout bounds creating or dropping one test database.
const opTimeout = time.Minute

var (
	mainCalled atomic.Bool

	setupOnce sync.Once
	setupErr  error

	// Set by setup and read-only afterwards.
	cluster  *pgcluster.Cluster // nil when using STINT_TEST_DATABASE_URL
	dataDir  string             // the cluster's temporary directory
	adminDSN string             // the maintenance database
	shared   bool               // whether STINT_TEST_DATABASE_URL is used
	template string             // the migrated template database
	strategy string             // " STRATEGY FILE_COPY" on PostgreSQL 15 and later, where it is faster
	prefix   string             // prefix of this binary's test database names

	templateCreated atomic.Bool
	createMu        sync.Mutex // serializes CREATE DATABASE ... TEMPLATE within the process
	dbCounter       atomic.Int64
)

// Main runs the tests of m, then stops the cluster this test binary started (and removes its
// directory) or, with STINT_TEST_DATABASE_URL, drops this binary's template database, and exits with
// the tests' exit code. Call it from TestMain.
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// EnvExampleDatabaseURL names the environment variable that
// MainWithExamples sets for a package's Example functions: the one many
// programs read their database from.
const EnvExampleDatabaseURL = "DATABASE_URL"

// MainWithExamples is Main for a package with Example functions, which
// have no testing.T to call New with: before the tests run, it creates a
// database like New's, dropped at the end, and sets DATABASE_URL to its
// DSN, where the examples read it as a program reads its environment.
// The package's examples share that database.
func MainWithExamples(m *testing.M) {
	os.Exit(RunWithExamples(m))
}

// RunWithExamples is MainWithExamples without the exit: it returns the
// exit code, for a TestMain that has more to clean up.
func RunWithExamples(m *testing.M) int {
	if !examplesMayRun() {
		return Run(m)
	}
	mainCalled.Store(true)
	if os.Getenv(EnvDatabaseURL) == "" {
		_ = ensureServer()
	}
	setupOnce.Do(setup)
	if setupErr != nil {
		fmt.Fprintf(os.Stderr, "pgtest: no database for the examples: %v\n", setupErr)
		return 1
	}
	name := fmt.Sprintf("%s_examples", prefix)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	err := createDatabase(ctx, name)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Setenv(EnvExampleDatabaseURL, dsnFor(name))
	code := Run(m)
	if shared {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		if err := dropDatabase(ctx, name); err != nil && code == 0 {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
			code = 1
		}
		cancel()
	}
	return code
}

// examplesMayRun reports whether the test binary's flags let Example
// functions run: not in a fuzzing worker, which runs the fuzz target
// alone, nor with -test.run '^$', which runs no test, nor with -test.list.
func examplesMayRun() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	value := func(name string) string {
		if f := flag.Lookup(name); f != nil {
			return f.Value.String()
		}
		return ""
	}
	return value("test.fuzzworker") != "true" && value("test.run") != "^$" && value("test.list") == ""
}

// Run is Main without the exit: it returns the exit code, for a TestMain that has more to clean up.
// Before the tests run, it installs the PostgreSQL server binaries if they are missing and it can.
func Run(m *testing.M) int {
	mainCalled.Store(true)
	if os.Getenv(EnvDatabaseURL) == "" {
		// Install the server binaries if they are missing before any test's deadline starts: an
		// install takes minutes. A failure is reported by New, to the tests that need a database.
		_ = ensureServer()
	}
	code := m.Run()
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// New returns the DSN of a fresh database, cloned from the migrated template, that is dropped when the
// test ends. It fails the test if no PostgreSQL is available or the database cannot be created.
func New(t testing.TB) string {
	t.Helper()
	return dsnFor(newDatabase(t))
}

// newDatabase creates a fresh database from the template, dropped when the
// test ends, and returns its name.
func newDatabase(t testing.TB) string {
	t.Helper()
	if !mainCalled.Load() {
		t.Fatal("pgtest.New needs pgtest.Main to clean up after the tests: add `func TestMain(m *testing.M) { pgtest.Main(m) }` to this package's tests")
	}
	setupOnce.Do(setup)
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	name := fmt.Sprintf("%s_%d", prefix, dbCounter.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := createDatabase(ctx, name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := dropDatabase(ctx, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return name
}

// Cluster returns the cluster this test binary started, so that fault tests can stop or restart
// PostgreSQL, or nil when STINT_TEST_DATABASE_URL is set (or the cluster could not be started; New
// reports why). Call New first.
func Cluster() *pgcluster.Cluster {
	setupOnce.Do(setup)
	return cluster
}

// AdminDSN returns the DSN of the maintenance database ("postgres" on the binary's own cluster, the
// database of STINT_TEST_DATABASE_URL otherwise), or "" if PostgreSQL is unavailable (New reports why).
func AdminDSN() string {
	setupOnce.Do(setup)
	if setupErr != nil {
		return ""
	}
	return adminDSN
}

// TempDir returns a new empty directory that the PostgreSQL server user can write to, for use as the
// DataDir of an extra pgcluster.Cluster, and removes it when the test ends. Unlike t.TempDir, it works
// when tests run as root. Stop such clusters before the test ends (register Stop with t.Cleanup after
// calling TempDir, so that it runs first).
func TempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp(pgcluster.ScratchDir(), "stint-pgtest-")
	if err != nil {
		t.Fatalf("pgtest: create temporary directory: %v", err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("pgtest: remove %s: %v", dir, err)
		}
	})
	return dir
}

// setup starts the cluster (unless STINT_TEST_DATABASE_URL is set) and builds the template database.
// It records its outcome in setupErr.
func setup() {
	if os.Getenv(EnvDatabaseURL) == "" {
		// Before the setup timeout starts: an install takes minutes.
		if err := ensureServer(); err != nil {
			setupErr = fmt.Errorf("pgtest: no PostgreSQL to test against: %w", err)
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	token, err := randomToken()
	if err != nil {
		setupErr = fmt.Errorf("pgtest: %w", err)
		return
	}
	prefix = "stint_test_" + token

	if u := os.Getenv(EnvDatabaseURL); u != "" {
		shared = true
		adminDSN = u
		template = fmt.Sprintf("stint_template_%d_%s", os.Getpid(), token)
	} else {
		removeStaleClusterDirs(pgcluster.ScratchDir())
		dir, err := os.MkdirTemp(pgcluster.ScratchDir(), clusterDirPrefix)
		if err != nil {
			setupErr = fmt.Errorf("pgtest: create the cluster's directory: %w", err)
			return
		}
		c, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: dir, Fast: true})
		if err != nil {
			_ = os.RemoveAll(dir)
			if errors.Is(err, pgcluster.ErrNoPostgres) {
				setupErr = fmt.Errorf("pgtest: no PostgreSQL to test against: %w", err)
			} else {
				setupErr = fmt.Errorf("pgtest: start a PostgreSQL cluster for the tests: %w", err)
			}
			return
		}
		cluster, dataDir = c, dir
		adminDSN = c.DSN("postgres")
		template = "stint_template"
	}
	if err := createTemplate(ctx); err != nil {
		setupErr = fmt.Errorf("pgtest: build the template database: %w", err)
	}
}

// ensureServer installs the PostgreSQL server binaries if they are missing and this process can.
func ensureServer() error {
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	_, err := pgcluster.EnsureBinDir(ctx)
	return err
}

// clusterDirPrefix starts the names of the directories that hold test binaries' clusters.
const clusterDirPrefix = "stint-pgcluster-"

// staleAfter is how old a cluster directory with no running server must be before it is removed as
// left over by a test binary that crashed.
const staleAfter = time.Hour

// removeStaleClusterDirs removes, as well as it can, the cluster directories in parent that test
// binaries which died without running Main left behind (the kernel stops their servers, but their
// files stay, in memory when parent is /dev/shm).
func removeStaleClusterDirs(parent string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), clusterDirPrefix) {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < staleAfter {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		if pgcluster.Running(dir) {
			continue
		}
		_ = os.RemoveAll(dir)
	}
}

// createTemplate creates the template database and migrates it. The connection to it is closed before
// it returns, since CREATE DATABASE ... TEMPLATE fails while anyone is connected to the template.
func createTemplate(ctx context.Context) error {
	err := withAdminConn(ctx, func(conn *pgx.Conn) error {
		// template0 rather than the default template1, which other sessions may be connected to.
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+quote(template)+" TEMPLATE template0"); err != nil {
			return fmt.Errorf("create database %s: %w", template, err)
		}
		templateCreated.Store(true)
		// Copying the template's files is faster for small databases than the WAL_LOG strategy that
		// PostgreSQL 15 made the default (and that older versions lack the syntax to choose).
		var version int
		if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
			return fmt.Errorf("query the server version: %w", err)
		}
		if version >= 150000 {
			strategy = " STRATEGY FILE_COPY"
		}
		return nil
	})
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, dsnFor(template))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", template, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := migrations.Up(ctx, conn); err != nil {
		return fmt.Errorf("migrate %s: %w", template, err)
	}
	if err := conn.Close(ctx); err != nil {
		return fmt.Errorf("close connection to %s: %w", template, err)
	}
	return nil
}

// createDatabase creates database name from the template.
func createDatabase(ctx context.Context, name string) error {
	createMu.Lock()
	defer createMu.Unlock()
	return withAdminConn(ctx, func(conn *pgx.Conn) error {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+quote(name)+" TEMPLATE "+quote(template)+strategy); err != nil {
			return fmt.Errorf("pgtest: create database %s from template %s: %w", name, template, err)
		}
		return nil
	})
}

// dropDatabase drops database name, disconnecting its sessions.
func dropDatabase(ctx context.Context, name string) error {
	return withAdminConn(ctx, func(conn *pgx.Conn) error {
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+quote(name)+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		return nil
	})
}

// withAdminConn runs fn on a new connection to the maintenance database, holding the cross-process
// advisory lock when the server is shared with other test binaries.
func withAdminConn(ctx context.Context, fn func(conn *pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return fmt.Errorf("connect to the maintenance database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if shared {
		// A session-level lock; closing the connection releases it.
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(lockKey)); err != nil {
			return fmt.Errorf("take the pgtest advisory lock: %w", err)
		}
	}
	return fn(conn)
}

// teardown drops the shared server's template database or stops the binary's own cluster.
func teardown() error {
	var errs []error
	if shared && templateCreated.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := dropDatabase(ctx, template); err != nil {
			errs = append(errs, err)
		}
	}
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop the test cluster: %w", err))
		} else if err := os.RemoveAll(dataDir); err != nil {
			errs = append(errs, fmt.Errorf("remove the test cluster's directory: %w", err))
		}
	}
	return errors.Join(errs...)
}

// dsnFor returns the DSN of database name on the server the tests use.
func dsnFor(name string) string {
	if cluster != nil {
		return cluster.DSN(name)
	}
	return pgcluster.WithDatabase(adminDSN, name)
}

// quote quotes a database name for use in SQL.
func quote(name string) string {
	return pgx.Identifier{name}.Sanitize()
}

// randomToken returns a short random hex string that keeps database names of concurrent test binaries
// apart.
func randomToken() (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate a random name: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
