package impl_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/provision"
	"github.com/stinthq/stint/store/postgres"
)

// pgBouncerPath returns PgBouncer's path, installing it where it can (see
// package provision). Where it cannot, the test is skipped, except under
// CI=true. Call it before the test's deadlines start: an install takes
// minutes.
func pgBouncerPath(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	return provision.Require(t, ctx, provision.PgBouncer)
}

// startPgBouncer runs PgBouncer in transaction mode in front of the
// database of dsn and returns the DSN through it.
func startPgBouncer(t *testing.T, dsn string) string {
	t.Helper()
	bin := pgBouncerPath(t)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	host, port, err := net.SplitHostPort(u.Host)
	require.NoError(t, err)
	db := u.Path[1:]
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	bouncerPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	dir := pgtest.TempDir(t)
	ini := filepath.Join(dir, "pgbouncer.ini")
	require.NoError(t, os.WriteFile(ini, fmt.Appendf(nil, `[databases]
%s = host=%s port=%s dbname=%s user=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 200
default_pool_size = 10
logfile = %s
`, db, host, port, db, bouncerPort, filepath.Join(dir, "pgbouncer.log")), 0o644))
	cmd := exec.Command(bin, ini)
	if os.Geteuid() == 0 { // PgBouncer refuses to run as root
		pg, err := user.Lookup("postgres")
		require.NoError(t, err)
		uid, _ := strconv.Atoi(pg.Uid)
		gid, _ := strconv.Atoi(pg.Gid)
		require.NoError(t, os.Chown(dir, uid, gid))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() { // keep PgBouncer's output in the test log
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Log("pgbouncer:", sc.Text())
		}
	}()
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(bouncerPort))
	q := u.Query()
	q.Set("default_query_exec_mode", "exec")
	u.RawQuery = q.Encode()
	waitFor(t, 10*time.Second, "PgBouncer to accept connections", func() bool {
		c, err := net.Dial("tcp", u.Host)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return u.String()
}

func TestThroughPgBouncerInTransactionMode(t *testing.T) {
	t.Parallel()
	pgBouncerPath(t)
	for _, mode := range []string{"direct LISTEN", "poll only"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			bouncer := startPgBouncer(t, e.dsn)
			opt := postgres.ListenDSN(e.dsn)
			if mode == "poll only" {
				opt = postgres.PollOnly()
			}
			open := func() *postgres.Store {
				st, err := postgres.Open(e.ctx, bouncer, opt)
				require.NoError(t, err)
				t.Cleanup(st.Close)
				return st
			}
			srvStore := open()
			srv, err := impl.NewServer(srvStore, impl.ServerConfig{Registry: testRegistry(e.pool, "bounced", 5*time.Second),
				PollInterval: 100 * time.Millisecond, AwaitPollInterval: 100 * time.Millisecond})
			require.NoError(t, err)
			require.NoError(t, srv.Start(e.ctx))
			t.Cleanup(func() { _ = srv.Stop(context.Background()) })
			client, err := impl.NewClient(open(), impl.ClientConfig{Registry: testRegistry(e.pool, "c", time.Second), PollInterval: 100 * time.Millisecond})
			require.NoError(t, err)
			t.Cleanup(client.Close)

			var futures []*api.Future[WorkResult]
			for i := range 50 {
				f, err := api.Submit(e.ctx, client, workKind, WorkParams{Key: fmt.Sprint(i), FailUntil: i % 2})
				require.NoError(t, err)
				futures = append(futures, f)
			}
			for i, f := range futures {
				res, err := f.Await(e.ctx)
				require.NoError(t, err)
				require.Equal(t, 1+i%2, res.Attempt)
			}
			require.Equal(t, 75, e.count(`SELECT count(*) FROM test_run`))
		})
	}
}
