package pgcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// Formation is a pg_auto_failover formation on this machine: a monitor and data nodes, each run by a
// `pg_autoctl ... --run` process of its own (the node's keeper, which runs its PostgreSQL server), on
// free ports (the data nodes listen on 127.0.0.1 only, the monitor as pg_autoctl sets it up), with trust
// authentication and no TLS. As root, everything runs as the server
// user (pg_autoctl, like PostgreSQL, refuses root). It is for tests: its servers run without fsync.
type Formation struct {
	autoctl string // pg_autoctl's path
	binDir  string
	dir     string
	user    *serverUser
	env     []string
	// Monitor is the monitor node.
	Monitor *FormationNode
	// Nodes are the data nodes, in the order they joined: the first was the first primary.
	Nodes []*FormationNode
}

// FormationNode is a node of a Formation: its keeper process and its PostgreSQL server.
type FormationNode struct {
	f *Formation
	// Name is the node's name in the formation ("monitor", "node1", ...).
	Name string
	// Port is its server's port on 127.0.0.1.
	Port    int
	dataDir string
	args    []string // the first start's pg_autoctl arguments

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// FormationTimeouts are the monitor's failover settings (its pgautofailover.* parameters); a zero
// field keeps pg_auto_failover's default.
type FormationTimeouts struct {
	// HealthCheckPeriod is how often the monitor checks each node (default 5 s).
	HealthCheckPeriod time.Duration
	// Unhealthy is how long a node's health checks fail and its keeper stays silent before the monitor
	// considers it unhealthy (node_considered_unhealthy_timeout, default 20 s).
	Unhealthy time.Duration
	// Demote is how long the monitor waits for an unhealthy primary to demote itself before it promotes
	// a standby (primary_demote_timeout, default 30 s). A keeper that lost the monitor and its standbys
	// demotes its primary after its own network partition timeout (20 s).
	Demote time.Duration
}

// StartFormation starts a monitor and data nodes under dir (which it creates; the server user must be
// able to reach it), one after the other, and returns once the first is the primary and every other a
// secondary streaming from it. ctx bounds the start; the processes run until Stop or until this process
// exits.
func StartFormation(ctx context.Context, dir string, dataNodes int, timeouts FormationTimeouts) (f *Formation, err error) {
	binDir, err := EnsureBinDir(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	tool, err := AutoFailover()
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	autoctl, err := tool.Find()
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	su, err := lookupServerUser()
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	f = &Formation{autoctl: autoctl, binDir: binDir, dir: dir, user: su}
	defer func() {
		if err != nil {
			err = errors.Join(err, f.Stop())
		}
	}()
	home := filepath.Join(dir, "home")
	for _, d := range []string{dir, home, filepath.Join(home, "config"), filepath.Join(home, "data"), filepath.Join(home, "run"), f.sockets()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return f, fmt.Errorf("pgcluster: create %s: %w", d, err)
		}
		if su != nil {
			if err := os.Chown(d, int(su.uid), int(su.gid)); err != nil {
				return f, fmt.Errorf("pgcluster: give %s to user %s: %w", d, su.name, err)
			}
		}
	}
	if su != nil {
		if err := checkSearchable(dir, su); err != nil {
			return f, fmt.Errorf("pgcluster: %w", err)
		}
	}
	// pg_autoctl keeps its configuration and state under the XDG directories, and connects to its own
	// server through the socket directory as the superuser postgres.
	f.env = append(serverEnv(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, "config"),
		"XDG_DATA_HOME="+filepath.Join(home, "data"), "XDG_RUNTIME_DIR="+filepath.Join(home, "run"),
		"PATH="+binDir+":/usr/local/bin:/usr/bin:/bin", "PGHOST="+f.sockets(), "PGUSER=postgres",
		// Connections that name no connect_timeout: the servers of a busy test machine may take more
		// than pg_autoctl's own 2 s to accept one.
		"PGCONNECT_TIMEOUT=15")

	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	m, err := f.newNode(ctx, "monitor", true)
	if err != nil {
		return f, err
	}
	m.args = []string{"create", "monitor", "--pgdata", m.dataDir, "--pgport", strconv.Itoa(m.Port), "--hostname", "127.0.0.1",
		"--auth", "trust", "--no-ssl", "--run"}
	f.Monitor = m
	if err := m.Start(ctx); err != nil {
		return f, err
	}
	if err := f.waitMonitor(ctx); err != nil {
		return f, err
	}
	var set []string
	for name, d := range map[string]time.Duration{"health_check_period": timeouts.HealthCheckPeriod,
		"node_considered_unhealthy_timeout": timeouts.Unhealthy, "primary_demote_timeout": timeouts.Demote} {
		if d > 0 {
			set = append(set, fmt.Sprintf(`ALTER SYSTEM SET pgautofailover.%s = %d`, name, d.Milliseconds()))
		}
	}
	if len(set) > 0 {
		if err := f.monitorExec(ctx, append(set, `SELECT pg_reload_conf()`)...); err != nil {
			return f, err
		}
	}
	for i := range dataNodes {
		// The first node's cluster is made here, so that its settings (which its standbys' copies
		// inherit) fit a test machine; a standby's data directory must be empty.
		n, err := f.newNode(ctx, fmt.Sprint("node", i+1), i == 0)
		if err != nil {
			return f, err
		}
		n.args = []string{"create", "postgres", "--pgdata", n.dataDir, "--pgport", strconv.Itoa(n.Port), "--hostname", "127.0.0.1",
			"--listen", "127.0.0.1", "--name", n.Name, "--auth", "trust", "--no-ssl", "--monitor", f.MonitorURI(), "--run"}
		f.Nodes = append(f.Nodes, n)
		if err := n.Start(ctx); err != nil {
			return f, err
		}
		want := "secondary"
		if i == 0 {
			want = "single"
		}
		if err := f.WaitState(ctx, func(s map[string]NodeState) bool { return s[n.Name].Reported == want }); err != nil {
			return f, fmt.Errorf("%w\n%s", err, n.logTail())
		}
	}
	err = f.WaitState(ctx, func(s map[string]NodeState) bool {
		for _, n := range f.Nodes {
			if st := s[n.Name]; st.Reported != st.Assigned {
				return false
			}
		}
		return true
	})
	return f, err
}

// sockets is the Unix socket directory of every server of f.
func (f *Formation) sockets() string { return filepath.Join(f.dir, "sockets") }

// newNode picks a port and a data directory for a node; with initdb, it makes the cluster there too,
// with settings for a shared test machine.
func (f *Formation) newNode(ctx context.Context, name string, initdb bool) (*FormationNode, error) {
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("pgcluster: pick a free port: %w", err)
	}
	n := &FormationNode{f: f, Name: name, Port: port, dataDir: filepath.Join(f.dir, name)}
	if !initdb {
		return n, nil
	}
	var out bytes.Buffer
	cmd := f.command(ctx, filepath.Join(f.binDir, "initdb"), "--auth=trust", "--username=postgres", "--no-sync", "--pgdata="+n.dataDir)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("pgcluster: initdb for %s: %w\n%s", name, err, tail(out.Bytes(), 4096))
	}
	// postgresql.auto.conf is read after pg_auto_failover's settings, which size memory for the whole
	// machine and keep 8 GB of WAL.
	conf := fmt.Sprintf("unix_socket_directories = '%s'\nshared_buffers = '64MB'\neffective_cache_size = '256MB'\n"+
		"maintenance_work_mem = '64MB'\nwork_mem = '4MB'\nmax_connections = 300\nwal_keep_size = '512MB'\nfsync = off\n", f.sockets())
	file, err := os.OpenFile(filepath.Join(n.dataDir, "postgresql.auto.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: configure %s: %w", name, err)
	}
	_, err = file.WriteString(conf)
	if err = errors.Join(err, file.Close()); err != nil {
		return nil, fmt.Errorf("pgcluster: configure %s: %w", name, err)
	}
	return n, nil
}

// command returns a command that runs as the server user with f's environment.
func (f *Formation) command(ctx context.Context, path string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = f.dir
	cmd.Env = f.env
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if f.user != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: f.user.uid, Gid: f.user.gid, Groups: []uint32{}}
	}
	return cmd
}

// MonitorURI is the URL keepers and pg_autoctl commands reach the monitor at.
func (f *Formation) MonitorURI() string {
	return fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", f.Monitor.Port)
}

// URI is the multi-host URL of database dbname on the data nodes, as the superuser postgres, that asks
// for the node that accepts writes (target_session_attrs=read-write): the URL `pg_autoctl show uri`
// prints, with a user and a database.
func (f *Formation) URI(dbname string) string {
	hosts := make([]string, len(f.Nodes))
	for i, n := range f.Nodes {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(n.Port)
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/" + dbname + "?sslmode=disable&target_session_attrs=read-write"
}

// DSN is the URL of database dbname on n alone, as the superuser postgres.
func (n *FormationNode) DSN(dbname string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", n.Port, dbname)
}

// Start starts n's keeper: `pg_autoctl create ... --run` the first time, `pg_autoctl run` after
// Kill. It returns once the process runs; WaitState tells when the node has its state.
func (n *FormationNode) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return fmt.Errorf("pgcluster: start %s: it runs already", n.Name)
	}
	args := n.args
	if _, err := os.Stat(filepath.Join(n.dataDir, "PG_VERSION")); err == nil && n.exited != nil {
		args = []string{"run", "--pgdata", n.dataDir}
	}
	log, err := os.OpenFile(n.LogFile(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgcluster: open the log of %s: %w", n.Name, err)
	}
	defer log.Close() // the child holds its own descriptor
	// The keeper outlives ctx: it runs until Kill or Stop.
	cmd := n.f.command(context.Background(), n.f.autoctl, args...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, so that Kill takes the keeper and its server at once; SIGTERM (a clean
	// stop of the keeper and its server) if this process dies.
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	if err := startOnLockedThread(cmd); err != nil {
		return fmt.Errorf("pgcluster: start pg_autoctl for %s: %w", n.Name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	n.cmd, n.exited = cmd, exited
	return nil
}

// logTail returns the end of n's keeper log, to explain a failure.
func (n *FormationNode) logTail() string { return n.LogTail(4096) }

// LogTail returns the last size bytes of n's keeper log, from a line's start, after a line that names
// the file.
func (n *FormationNode) LogTail(size int) string {
	return fmt.Sprintf("the end of %s:\n%s", n.LogFile(), readTail(n.LogFile(), 0, size))
}

// LogFile is the file that receives the output of n's keeper.
func (n *FormationNode) LogFile() string { return filepath.Join(n.f.dir, n.Name+".log") }

// Kill kills n whole, keeper and server, with SIGKILL, as a crash of its machine would.
func (n *FormationNode) Kill() error { return n.signal(syscall.SIGKILL, 10*time.Second) }

// KillServer kills n's PostgreSQL server alone (its postmaster) with SIGKILL; its keeper goes on and
// restarts it.
func (n *FormationNode) KillServer() error {
	pid, _, ok := readPostmasterPID(n.dataDir)
	if !ok {
		return fmt.Errorf("pgcluster: kill the server of %s: no postmaster.pid in %s", n.Name, n.dataDir)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("pgcluster: kill the server of %s (pid %d): %w", n.Name, pid, err)
	}
	return nil
}

// signal sends sig to n's process group and waits up to wait for its keeper to exit.
func (n *FormationNode) signal(sig syscall.Signal, wait time.Duration) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return nil
	}
	if err := syscall.Kill(-n.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("pgcluster: signal %s (pid %d): %w", n.Name, n.cmd.Process.Pid, err)
	}
	select {
	case <-n.exited:
	case <-time.After(wait):
		return fmt.Errorf("pgcluster: %s (pid %d) did not exit within %s of %v", n.Name, n.cmd.Process.Pid, wait, sig)
	}
	n.cmd = nil
	if sig == syscall.SIGKILL {
		// The server's children die with the postmaster, which may be in no group of the keeper's.
		if pid, _, ok := readPostmasterPID(n.dataDir); ok && postgresAlive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return nil
}

// Stop stops every node, data nodes first: SIGTERM, then SIGKILL for one that does not exit within a
// minute.
func (f *Formation) Stop() error {
	var errs []error
	for _, n := range append(append([]*FormationNode(nil), f.Nodes...), f.Monitor) {
		if n == nil {
			continue
		}
		if err := n.signal(syscall.SIGTERM, time.Minute); err != nil {
			errs = append(errs, err, n.Kill())
		}
	}
	return errors.Join(errs...)
}

// NodeState is a data node's state as the monitor shows it.
type NodeState struct {
	// Reported is the state the node's keeper last reported ("primary", "secondary", ...).
	Reported string
	// Assigned is the state the monitor assigned it.
	Assigned string
}

// States returns the monitor's view of the data nodes, by name.
func (f *Formation) States(ctx context.Context) (map[string]NodeState, error) {
	var out bytes.Buffer
	cmd := f.command(ctx, f.autoctl, "show", "state", "--json", "--monitor", f.MonitorURI())
	cmd.Stdout, cmd.Stderr = &out, &bytes.Buffer{}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("pgcluster: pg_autoctl show state: %w", err)
	}
	var rows []struct {
		Name     string `json:"nodename"`
		Reported string `json:"current_group_state"`
		Assigned string `json:"assigned_group_state"`
	}
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		return nil, fmt.Errorf("pgcluster: read pg_autoctl show state: %w: %s", err, tail(out.Bytes(), 2048))
	}
	states := make(map[string]NodeState, len(rows))
	for _, r := range rows {
		if r.Name == "" || r.Reported == "" {
			return nil, fmt.Errorf("pgcluster: read pg_autoctl show state: a node without a name or state: %s", tail(out.Bytes(), 2048))
		}
		states[r.Name] = NodeState{Reported: r.Reported, Assigned: r.Assigned}
	}
	return states, nil
}

// WaitState polls the monitor's view every 200 ms until ok holds of it or ctx ends.
func (f *Formation) WaitState(ctx context.Context, ok func(map[string]NodeState) bool) error {
	var last map[string]NodeState
	var lastErr error
	for {
		s, err := f.States(ctx)
		if err == nil && ok(s) {
			return nil
		}
		if err == nil {
			last = s
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: wait for the formation's state (last seen %v, last error %v): %w", last, lastErr, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Primary returns the data node the monitor shows as the primary, or nil.
func (f *Formation) Primary(ctx context.Context) (*FormationNode, error) {
	s, err := f.States(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range f.Nodes {
		if st := s[n.Name]; st.Reported == "primary" && st.Assigned == "primary" {
			return n, nil
		}
	}
	return nil, nil
}

// Switchover has the monitor hand the primary's role to a secondary, as `pg_autoctl perform
// switchover` does (by the monitor's function that command calls: the command of pg_auto_failover 2.0
// fails waiting for the new primary when given the monitor's URL), and returns once the monitor took
// it; WaitState tells when it is done.
func (f *Formation) Switchover(ctx context.Context) error {
	return f.monitorExec(ctx, `SELECT pgautofailover.perform_failover('default', 0)`)
}

// waitMonitor waits until the monitor's database answers with its extension installed.
func (f *Formation) waitMonitor(ctx context.Context) error {
	for {
		err := f.monitorExec(ctx, `SELECT 1 FROM pg_extension WHERE extname = 'pgautofailover' HAVING count(*) = 1`)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: the monitor did not start: %w; last error: %w\n%s", ctx.Err(), err, f.Monitor.logTail())
		case <-f.Monitor.exited:
			return fmt.Errorf("pgcluster: the monitor's pg_autoctl exited\n%s", f.Monitor.logTail())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// monitorExec runs statements on the monitor's database as the superuser; a query must return a row.
func (f *Formation) monitorExec(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, f.Monitor.DSN("pg_auto_failover"))
	if err != nil {
		return fmt.Errorf("pgcluster: connect to the monitor: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range stmts {
		tag, err := conn.Exec(ctx, q)
		if err != nil {
			return fmt.Errorf("pgcluster: on the monitor: %s: %w", q, err)
		}
		if tag.Select() && tag.RowsAffected() == 0 {
			return fmt.Errorf("pgcluster: on the monitor: %s: no row", q)
		}
	}
	return nil
}
