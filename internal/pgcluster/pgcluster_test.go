package pgcluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestMain installs the PostgreSQL server binaries first if they are missing (and this process can),
// outside the tests' own deadlines: an install takes minutes, longer when another test binary holds the
// install lock.
func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	_, err := EnsureBinDir(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgcluster tests:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// tempDataDir returns a fresh directory, usable as a data directory by the server user, that is
// removed when the test ends. t.TempDir is not used because, when running as root, its parents are
// not searchable by the unprivileged server user.
func tempDataDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(ScratchDir(), "stint-pgcluster-test-")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, os.RemoveAll(dir)) })
	return dir
}

// startCluster starts a fast cluster in a fresh data directory and stops it when the test ends.
func startCluster(t *testing.T, opts Options) *Cluster {
	t.Helper()
	if opts.DataDir == "" {
		opts.DataDir = tempDataDir(t)
	}
	opts.Fast = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Stop()) })
	return c
}

// selectOne connects to dsn and checks that SELECT 1 answers 1.
func selectOne(t *testing.T, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var one int
	require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.Equal(t, 1, one)
}

func TestBinDir(t *testing.T) {
	dir, err := BinDir()
	require.NoError(t, err)
	require.True(t, hasServerBinaries(dir), "BinDir returned %s, which lacks the server binaries", dir)
}

func TestStartRestartStop(t *testing.T) {
	dataDir := tempDataDir(t)
	c := startCluster(t, Options{DataDir: dataDir})
	require.NotZero(t, c.Port())
	require.Equal(t, dataDir, c.DataDir())
	require.False(t, c.Reused())
	require.FileExists(t, filepath.Join(dataDir, "PG_VERSION"))
	require.Equal(t, "postgres://postgres@127.0.0.1:"+strconv.Itoa(c.Port())+"/postgres?sslmode=disable", c.DSN("postgres"))
	selectOne(t, c.DSN("postgres"))

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var fsync, maxConns string
	require.NoError(t, conn.QueryRow(ctx, "SHOW fsync").Scan(&fsync))
	require.NoError(t, conn.QueryRow(ctx, "SHOW max_connections").Scan(&maxConns))
	require.Equal(t, "off", fsync)
	require.Equal(t, "300", maxConns)

	port := c.Port()
	require.NoError(t, c.Restart(ctx))
	require.Equal(t, port, c.Port())
	require.Error(t, conn.Ping(ctx), "a connection from before the restart should be broken")
	selectOne(t, c.DSN("postgres"))

	require.NoError(t, c.Stop())
	require.NoFileExists(t, filepath.Join(dataDir, "postmaster.pid"))
	_, err = pgx.Connect(ctx, c.DSN("postgres"))
	require.Error(t, err, "the stopped server should refuse connections")
	require.NoError(t, c.Stop(), "stopping a stopped cluster should do nothing")

	// Starting again on the existing data directory skips initdb and keeps the data.
	c2 := startCluster(t, Options{DataDir: dataDir})
	require.False(t, c2.Reused())
	selectOne(t, c2.DSN("postgres"))
}

func TestStartReusesRunningServer(t *testing.T) {
	first := startCluster(t, Options{Detach: true})
	second, err := Start(context.Background(), Options{DataDir: first.DataDir()})
	require.NoError(t, err)
	require.True(t, second.Reused())
	require.Equal(t, first.Port(), second.Port())
	selectOne(t, second.DSN("postgres"))

	_, err = Start(context.Background(), Options{DataDir: first.DataDir(), Port: first.Port() + 1})
	require.ErrorContains(t, err, "already running")

	// Stopping through the reusing handle stops the server.
	require.NoError(t, second.Stop())
	require.NoFileExists(t, filepath.Join(first.DataDir(), "postmaster.pid"))
	require.NoError(t, first.Stop())
}

func TestStartFailureIncludesServerLog(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port

	_, err = Start(context.Background(), Options{DataDir: tempDataDir(t), Port: port, Fast: true})
	require.Error(t, err)
	require.ErrorContains(t, err, "server log")
	require.ErrorContains(t, err, "Address already in use")
}

func TestStartPicksAnotherPortWhenTaken(t *testing.T) {
	// Two clusters started at once on automatic ports must both come up.
	errs := make(chan error, 2)
	clusters := make(chan *Cluster, 2)
	for range 2 {
		dir := tempDataDir(t)
		go func() {
			c, err := Start(context.Background(), Options{DataDir: dir, Fast: true})
			if err == nil {
				clusters <- c
			}
			errs <- err
		}()
	}
	for range 2 {
		require.NoError(t, <-errs)
	}
	close(clusters)
	var ports []int
	for c := range clusters {
		ports = append(ports, c.Port())
		selectOne(t, c.DSN("postgres"))
		require.NoError(t, c.Stop())
	}
	require.Len(t, ports, 2)
	require.NotEqual(t, ports[0], ports[1])
}

func TestBinDirDebianLayoutPicksHighestVersion(t *testing.T) {
	root := t.TempDir()
	makeBin := func(version string, names ...string) {
		dir := filepath.Join(root, version, "bin")
		require.NoError(t, os.MkdirAll(dir, 0o755))
		for _, n := range names {
			require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755))
		}
	}
	makeBin("9.6", serverBinaries...)
	makeBin("13", serverBinaries...)
	makeBin("16", "pg_dump") // client only: not a candidate
	require.NoError(t, os.MkdirAll(filepath.Join(root, "notaversion", "bin"), 0o755))
	require.Equal(t, filepath.Join(root, "13", "bin"), highestDebianBinDir(root))

	// With nothing on PATH and no server in the Debian layout, BinDir explains how to install PostgreSQL.
	t.Setenv("PATH", t.TempDir())
	old := debianLibDir
	debianLibDir = filepath.Join(root, "16")
	t.Cleanup(func() { debianLibDir = old })
	_, err := BinDir()
	require.ErrorIs(t, err, ErrNoPostgres)
	require.ErrorContains(t, err, "apt-get install postgresql")
	require.ErrorContains(t, err, "STINT_TEST_DATABASE_URL")

	debianLibDir = root
	dir, err := BinDir()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, "13", "bin"), dir)
}

func TestWithDatabase(t *testing.T) {
	require.Equal(t, "postgres://u:p@h:5432/other?sslmode=disable",
		WithDatabase("postgres://u:p@h:5432/postgres?sslmode=disable", "other"))
	require.Equal(t, "postgresql://h/other", WithDatabase("postgresql://h", "other"))
	require.Equal(t, "host=h dbname=postgres dbname=other", WithDatabase("host=h dbname=postgres", "other"))
}

func TestReachableDataDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: the data directory moves only when this process runs as root")
	}
	root := tempDataDir(t)
	require.NoError(t, os.Chmod(root, 0o755))
	old := reachableRoot
	reachableRoot = filepath.Join(root, "reachable")
	t.Cleanup(func() { reachableRoot = old })

	// A parent the server user can enter keeps the data directory where it is.
	open := filepath.Join(root, "open")
	require.NoError(t, os.Mkdir(open, 0o755))
	dir, moved, err := ReachableDataDir(filepath.Join(open, "pgdata"))
	require.NoError(t, err)
	require.False(t, moved)
	require.Equal(t, filepath.Join(open, "pgdata"), dir)

	// Like root's home directory on Debian: mode 0700, owned by root.
	home := filepath.Join(root, "home")
	require.NoError(t, os.Mkdir(home, 0o700))
	require.NoError(t, os.Mkdir(filepath.Join(home, ".stint"), 0o755))
	want := filepath.Join(home, ".stint", "pgdata")
	dir, moved, err = ReachableDataDir(want)
	require.NoError(t, err)
	require.True(t, moved)
	require.Equal(t, reachableRoot, filepath.Dir(filepath.Dir(dir)))
	require.Equal(t, "pgdata", filepath.Base(dir))
	again, _, err := ReachableDataDir(want)
	require.NoError(t, err)
	require.Equal(t, dir, again, "the same directory each time, so that the cluster is kept between runs")
	other, _, err := ReachableDataDir(filepath.Join(home, "other", "pgdata"))
	require.NoError(t, err)
	require.NotEqual(t, dir, other)

	// Start refuses the wanted directory and works in the returned one.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = Start(ctx, Options{DataDir: want, Fast: true})
	require.ErrorContains(t, err, "cannot enter "+home)
	c := startCluster(t, Options{DataDir: dir})
	selectOne(t, c.DSN("postgres"))
}

func TestEnsureBinDirFound(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir, err := EnsureBinDir(ctx)
	require.NoError(t, err)
	require.True(t, hasServerBinaries(dir), "EnsureBinDir returned %s, which lacks the server binaries", dir)
}
