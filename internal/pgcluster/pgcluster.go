// Package pgcluster starts and stops a local PostgreSQL cluster from the installed server binaries;
// it is used by tests (through package pgtest) and by `stint dev`.
//
// A cluster lives in a data directory. Start runs initdb there if the directory does not hold a cluster
// yet, then starts the server listening on 127.0.0.1 only (no Unix socket), with trust authentication
// for the superuser "postgres". When the process runs as root, initdb and the server run as the
// unprivileged system user "postgres" (or "nobody" if there is no such user), because PostgreSQL refuses
// to run as root; the data directory is then chowned to that user, and every directory above it must be
// searchable by that user (ReachableDataDir finds a place that is).
//
// When the server binaries are missing, Start installs them first where it can (see EnsureBinDir).
//
// If a server is already running in the data directory and answers on 127.0.0.1, Start reuses it
// instead of failing (Cluster.Reused reports this), so that running `stint dev` twice works.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultStartTimeout bounds how long Start and Restart wait for the server to accept connections when
// the context has no earlier deadline.
const DefaultStartTimeout = 90 * time.Second

// reuseTimeout bounds how long Start waits for a server already running in the data directory to
// accept connections before giving up on reusing it.
const reuseTimeout = 20 * time.Second

// stopTimeout bounds how long Stop waits for a fast shutdown before escalating.
const stopTimeout = 60 * time.Second

// LogFileName is the name of the file, inside the data directory, that receives the server's output.
const LogFileName = "stint-postgres.log"

// Options configures Start.
type Options struct {
	// DataDir is the cluster's data directory. It is created (mode 0700) if missing and initialized
	// with initdb if it holds no PG_VERSION file. It is required.
	DataDir string
	// Port is the TCP port on 127.0.0.1 to listen on; 0 picks a free port (retrying with another one
	// if a concurrent process takes it first).
	Port int
	// Log, if set, also receives initdb's and the server's output (which always goes to the file
	// LogFileName in DataDir). It must stay usable until Stop returns, and it is not used when Detach
	// is set.
	Log io.Writer
	// Fast turns off durability (fsync, synchronous_commit, full_page_writes) for speed. Tests use it;
	// a crash of the machine can then corrupt the cluster.
	Fast bool
	// Detach lets the server outlive this process: it runs in its own session and is not stopped when
	// this process exits, so a later Start on the same DataDir reuses it. Without Detach the kernel
	// stops the server (fast shutdown) when this process exits, so a crashed test binary leaks no
	// server.
	Detach bool
	// Settings are further server settings, as NAME=VALUE, given to the
	// server on its command line (ssl=on, say).
	Settings []string
	// Files are written into the data directory before the server starts,
	// by name, readable by the server's account only (mode 0600): a
	// certificate and key for ssl_cert_file and ssl_key_file, say.
	Files map[string][]byte
}

// Cluster is a running PostgreSQL server started, or reused, by Start. Its methods are safe for
// concurrent use.
type Cluster struct {
	binDir  string
	dataDir string
	port    int
	fast    bool
	detach  bool
	log     io.Writer
	user    *serverUser
	// settings and files are Options.Settings and Options.Files.
	settings []string
	files    map[string][]byte
	// primary and slot are set on a standby (see StartStandby): the
	// cluster it streams from and its replication slot there.
	primary *Cluster
	slot    string

	mu      sync.Mutex
	running bool
	reused  bool
	child   *exec.Cmd     // the server process when this process started it, else nil
	exited  chan struct{} // closed when child has exited
	waitErr error         // child's exit status, valid once exited is closed
}

// Start starts a PostgreSQL server in opts.DataDir, running initdb first if the directory holds no
// cluster, and waits until the server accepts connections. If a server is already running in that
// directory and answers on 127.0.0.1 (on opts.Port, when that is not 0), Start returns it with Reused
// set instead of starting another one. The wait is bounded by ctx and by DefaultStartTimeout. When the
// server fails to start, the error includes the tail of its log.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.DataDir == "" {
		return nil, errors.New("pgcluster: Options.DataDir is required")
	}
	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: resolve data directory %q: %w", opts.DataDir, err)
	}
	binDir, err := EnsureBinDir(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	su, err := lookupServerUser()
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c := &Cluster{
		binDir:  binDir,
		dataDir: dataDir,
		port:    opts.Port,
		fast:    opts.Fast,
		detach:  opts.Detach,
		log:     opts.Log,
		user:    su,

		settings: opts.Settings,
		files:    opts.Files,
	}

	if pid, port, ok := readPostmasterPID(dataDir); ok && postgresAlive(pid) {
		if opts.Port != 0 && port != opts.Port {
			return nil, fmt.Errorf("pgcluster: a PostgreSQL server (pid %d) is already running in %s on port %d, not on the requested port %d; stop it first",
				pid, dataDir, port, opts.Port)
		}
		// A running server answers at once, or within seconds if it is still starting up.
		ctx, cancel := context.WithTimeout(ctx, reuseTimeout)
		defer cancel()
		c.port = port
		if err := c.waitReady(ctx, nil); err != nil {
			return nil, fmt.Errorf("pgcluster: a PostgreSQL server (pid %d) is already running in %s but does not accept connections on 127.0.0.1:%d: %w",
				pid, dataDir, port, err)
		}
		c.running = true
		c.reused = true
		return c, nil
	}

	if err := c.prepareDataDir(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()

	if opts.Port != 0 {
		if err := c.startServer(ctx); err != nil {
			return nil, err
		}
		return c, nil
	}
	const attempts = 5
	for i := 1; ; i++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("pgcluster: pick a free port: %w", err)
		}
		c.port = port
		err = c.startServer(ctx)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, errPortInUse) || i == attempts {
			return nil, err
		}
	}
}

// DSN returns the URL for connecting to database dbname on this cluster as the superuser postgres.
func (c *Cluster) DSN(dbname string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, url.PathEscape(dbname))
}

// WithDatabase returns dsn, a URL or a keyword/value connection string, with
// its database set to name: for connecting to another database of the same
// server.
func WithDatabase(dsn, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Path = "/" + name
			u.RawPath = ""
			q := u.Query()
			if q.Has("dbname") {
				q.Set("dbname", name)
				u.RawQuery = q.Encode()
			}
			return u.String()
		}
	}
	// In keyword/value strings the last setting of a keyword wins.
	return dsn + " dbname=" + name
}

// Port returns the TCP port the server listens on at 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// DataDir returns the absolute path of the cluster's data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// LogFile returns the path of the file that receives the server's output when this process starts it.
func (c *Cluster) LogFile() string { return filepath.Join(c.dataDir, LogFileName) }

// Reused reports whether Start found the server already running and reused it rather than starting it.
// Restart clears it, since the server is then started by this process.
func (c *Cluster) Reused() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reused
}

// Stop shuts the server down with a fast shutdown (like `pg_ctl stop -m fast`: open sessions are
// disconnected, then a checkpoint is written) and waits until it has exited. It also stops a reused
// server. A standby's Stop then drops its replication slot on the primary. Stopping a stopped cluster
// does nothing.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.stopLocked(); err != nil {
		return err
	}
	if c.slot != "" {
		if err := c.primary.dropSlot(c.slot); err != nil {
			return err
		}
		c.slot = ""
	}
	return nil
}

// Restart stops the server and starts it again on the same port and data directory, waiting until it
// accepts connections again. Existing connections are broken. The wait is bounded by ctx and by
// DefaultStartTimeout.
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.stopLocked(); err != nil {
		return err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	return c.startServer(ctx)
}

// errPortInUse marks a start that failed because another process listens on the port.
var errPortInUse = errors.New("port already in use")

// prepareDataDir creates the data directory, gives it to the server user and runs initdb if the
// directory holds no cluster yet.
func (c *Cluster) prepareDataDir(ctx context.Context) error {
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		return fmt.Errorf("pgcluster: create data directory: %w", err)
	}
	if c.user != nil {
		if err := checkSearchable(filepath.Dir(c.dataDir), c.user); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); err == nil {
		return c.writeFiles()
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("pgcluster: inspect data directory: %w", err)
	}
	if c.user != nil {
		if err := os.Chown(c.dataDir, int(c.user.uid), int(c.user.gid)); err != nil {
			return fmt.Errorf("pgcluster: give data directory %s to user %s: %w", c.dataDir, c.user.name, err)
		}
	}
	var out bytes.Buffer
	cmd := c.command(ctx, "initdb",
		"--pgdata="+c.dataDir,
		"--username=postgres",
		"--auth=trust",
		"--encoding=UTF8",
		"--locale=C",
		"--no-sync",
	)
	var w io.Writer = &out
	if c.log != nil {
		w = io.MultiWriter(&out, ignoreErrors{c.log})
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgcluster: initdb in %s failed: %w\n%s", c.dataDir, err, tail(out.Bytes(), 4096))
	}
	return c.writeFiles()
}

// writeFiles writes Options.Files into the data directory, owned by the
// server's account.
func (c *Cluster) writeFiles() error {
	for name, b := range c.files {
		path := filepath.Join(c.dataDir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return fmt.Errorf("pgcluster: write %s: %w", path, err)
		}
		if c.user != nil {
			if err := os.Chown(path, int(c.user.uid), int(c.user.gid)); err != nil {
				return fmt.Errorf("pgcluster: give %s to user %s: %w", path, c.user.name, err)
			}
		}
	}
	return nil
}

// startServer starts the postgres process on c.port and waits until it accepts connections.
// The caller holds c.mu or owns c exclusively.
func (c *Cluster) startServer(ctx context.Context) error {
	logPath := c.LogFile()
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgcluster: open server log: %w", err)
	}
	defer logFile.Close() // the child holds its own descriptor
	var logStart int64
	if fi, err := logFile.Stat(); err == nil {
		logStart = fi.Size()
	}

	args := []string{
		"-D", c.dataDir,
		"-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "max_connections=300",
		// Room for many standbys at once (see StartStandby): each copy
		// takes two WAL senders while it runs, and each standby one sender
		// and one slot.
		"-c", "max_wal_senders=40",
		"-c", "max_replication_slots=40",
	}
	for _, kv := range c.settings {
		args = append(args, "-c", kv)
	}
	if c.fast {
		args = append(args,
			"-c", "fsync=off",
			"-c", "synchronous_commit=off",
			"-c", "full_page_writes=off",
		)
	}
	// The server outlives the start-up context: it runs until Stop.
	cmd := c.command(context.Background(), "postgres", args...)
	if c.detach {
		cmd.SysProcAttr.Setsid = true
		cmd.Stdout, cmd.Stderr = logFile, logFile
	} else {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGINT
		if c.log != nil {
			w := teeWriter{file: logFile, extra: c.log}
			cmd.Stdout, cmd.Stderr = w, w
		} else {
			cmd.Stdout, cmd.Stderr = logFile, logFile
		}
	}
	if err := startOnLockedThread(cmd); err != nil {
		return fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	exited := make(chan struct{})
	c.child, c.exited, c.waitErr = cmd, exited, nil
	go func() {
		err := cmd.Wait()
		c.waitErr = err
		close(exited)
	}()

	if err := c.waitReady(ctx, exited); err != nil {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		}
		c.child, c.exited = nil, nil
		logTail := readTail(logPath, logStart, 4096)
		if strings.Contains(logTail, "Address already in use") {
			err = fmt.Errorf("%w: %w", errPortInUse, err)
		}
		return fmt.Errorf("pgcluster: PostgreSQL in %s did not start on 127.0.0.1:%d: %w\nserver log (%s):\n%s",
			c.dataDir, c.port, err, logPath, logTail)
	}
	c.running = true
	c.reused = false
	return nil
}

// waitReady polls until the server on c.port accepts connections and serves c.dataDir, until ctx ends,
// or until exited (if not nil) is closed.
func (c *Cluster) waitReady(ctx context.Context, exited <-chan struct{}) error {
	wantDir := c.dataDir
	if d, err := filepath.EvalSymlinks(wantDir); err == nil {
		wantDir = d
	}
	if exited != nil {
		// Abandon a connection attempt as soon as the server exits.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-exited:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	var lastErr error
	for {
		select {
		case <-exited:
			return fmt.Errorf("server exited (%v)", c.waitErr)
		default:
		}
		dir, err := serverDataDir(ctx, c.DSN("postgres"))
		if err == nil {
			if d, evalErr := filepath.EvalSymlinks(dir); evalErr == nil {
				dir = d
			}
			if dir == wantDir {
				return nil
			}
			err = fmt.Errorf("port %d is served by another PostgreSQL server, whose data directory is %s", c.port, dir)
		}
		lastErr = err
		timer := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			timer.Stop()
			select {
			case <-exited:
				return fmt.Errorf("server exited (%v)", c.waitErr)
			default:
			}
			return fmt.Errorf("gave up waiting for the server to accept connections: %w (last attempt: %v)", ctx.Err(), lastErr)
		case <-exited:
			timer.Stop()
			return fmt.Errorf("server exited (%v)", c.waitErr)
		case <-timer.C:
		}
	}
}

// serverDataDir connects to dsn and returns the server's data directory.
func serverDataDir(ctx context.Context, dsn string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var dir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		return "", fmt.Errorf("query data_directory: %w", err)
	}
	return dir, nil
}

// minScratchFree is the free space /dev/shm needs for ScratchDir to choose it.
const minScratchFree = 1 << 30

// tmpfsMagic is the file system type statfs reports for tmpfs.
const tmpfsMagic = 0x01021994

// ScratchDir returns a directory to create throwaway clusters' data directories in (with
// os.MkdirTemp): /dev/shm when it is a memory file system with at least 1 GiB free and writable by
// this process, since on slow disks initdb and CREATE DATABASE run several times faster there, and
// os.TempDir() otherwise.
func ScratchDir() string {
	const shm = "/dev/shm"
	var st syscall.Statfs_t
	if err := syscall.Statfs(shm, &st); err != nil || st.Type != tmpfsMagic {
		return os.TempDir()
	}
	if st.Bavail*uint64(st.Bsize) < minScratchFree {
		return os.TempDir()
	}
	if err := syscall.Access(shm, 0o3); err != nil { // writable and searchable
		return os.TempDir()
	}
	return shm
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// withDefaultTimeout bounds ctx by DefaultStartTimeout unless it already ends sooner.
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) < DefaultStartTimeout {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, DefaultStartTimeout)
}

// readTail returns at most n bytes from the end of the file at path, starting no earlier than offset.
func readTail(path string, offset int64, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read the server log: %v)", err)
	}
	if offset > int64(len(b)) {
		offset = 0
	}
	return tail(b[offset:], n)
}

// tail returns at most the last n bytes of b, starting at a line boundary when it cuts.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	s := strings.TrimRight(string(b), "\n")
	if s == "" {
		return "(empty)"
	}
	return s
}

// teeWriter writes to a file and to an extra writer whose errors are ignored, so that a failing extra
// writer never stops the server's output from being drained.
type teeWriter struct {
	file  *os.File
	extra io.Writer
}

// Write writes p to both destinations and always reports success.
func (w teeWriter) Write(p []byte) (int, error) {
	_, _ = w.file.Write(p)
	_, _ = w.extra.Write(p)
	return len(p), nil
}

// ignoreErrors wraps a writer so that its errors are dropped.
type ignoreErrors struct{ w io.Writer }

// Write writes p to the wrapped writer and always reports success.
func (w ignoreErrors) Write(p []byte) (int, error) {
	_, _ = w.w.Write(p)
	return len(p), nil
}
