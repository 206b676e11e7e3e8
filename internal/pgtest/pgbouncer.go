package pgtest

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

	"github.com/stinthq/stint/internal/provision"
)

// PgBouncerPath returns PgBouncer's path, installing it where it can (see
// package provision). Where it cannot, the test is skipped, except under
// CI=true. Call it before the test's deadlines start: an install takes
// minutes.
func PgBouncerPath(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	return provision.Require(t, ctx, provision.PgBouncer)
}

// PgBouncer is a PgBouncer in transaction mode in front of one database,
// stopped when the test ends.
type PgBouncer struct {
	t    testing.TB
	bin  string
	ini  string
	dir  string
	addr string
	cmd  *exec.Cmd
	// URL is the database's URL through PgBouncer, with
	// default_query_exec_mode=exec (PgBouncer before 1.21 cannot keep
	// prepared statements across transactions).
	URL string
}

// StartPgBouncer runs PgBouncer in transaction mode in front of the
// database of dsn.
func StartPgBouncer(t testing.TB, dsn string) *PgBouncer {
	t.Helper()
	bin := PgBouncerPath(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("pgtest: parse %q: %v", dsn, err)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	db := u.Path[1:]
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	bouncerPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir := TempDir(t)
	ini := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(ini, fmt.Appendf(nil, `[databases]
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
`, db, host, port, db, bouncerPort, filepath.Join(dir, "pgbouncer.log")), 0o644); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(bouncerPort))
	q := u.Query()
	q.Set("default_query_exec_mode", "exec")
	u.RawQuery = q.Encode()
	b := &PgBouncer{t: t, bin: bin, ini: ini, dir: dir, addr: u.Host, URL: u.String()}
	b.start()
	t.Cleanup(b.Kill)
	return b
}

// start starts the process and waits until it accepts connections.
func (b *PgBouncer) start() {
	t := b.t
	cmd := exec.Command(b.bin, b.ini)
	if os.Geteuid() == 0 { // PgBouncer refuses to run as root
		pg, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		uid, _ := strconv.Atoi(pg.Uid)
		gid, _ := strconv.Atoi(pg.Gid)
		if err := os.Chown(b.dir, uid, gid); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("pgtest: start PgBouncer: %v", err)
	}
	b.cmd = cmd
	go func() { // keep PgBouncer's output in the test log
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Log("pgbouncer:", sc.Text())
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", b.addr)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: PgBouncer does not accept connections on %s: %v", b.addr, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}

// Kill kills PgBouncer with SIGKILL: every client connection breaks, and
// the port refuses connections until Start.
func (b *PgBouncer) Kill() {
	if b.cmd != nil {
		_ = b.cmd.Process.Kill()
		_ = b.cmd.Wait()
		b.cmd = nil
	}
}

// Restart kills PgBouncer and starts it again on the same port.
func (b *PgBouncer) Restart() {
	b.Kill()
	b.start()
}
