package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sys/unix"
)

// How a connection that stopped answering is found out. A network that
// drops packets without closing anything (a firewall or a NAT table that
// forgot the connection) leaves a connection open that will never answer;
// without these bounds a statement on it, or the listener waiting on it,
// would wait forever.
const (
	// ConnectTimeout bounds a connection attempt (per host of a
	// multi-host URL) when the URL sets no connect_timeout.
	ConnectTimeout = 10 * time.Second
	// keepAliveIdle, keepAliveInterval and keepAliveCount are the TCP
	// keepalive probes of every connection: an idle connection whose peer
	// is gone is dropped by the kernel after about 5 + 3*2 = 11 seconds.
	keepAliveIdle     = 5 * time.Second
	keepAliveInterval = 2 * time.Second
	keepAliveCount    = 3
	// userTimeout is TCP_USER_TIMEOUT: a connection whose sent data stays
	// unacknowledged this long is dropped by the kernel, so that a
	// statement sent into a dead path fails rather than waits for the
	// kernel's retransmissions (15 minutes by default on Linux).
	userTimeout = 15 * time.Second
	// pingTimeout bounds the liveness check the pool makes of a
	// connection that was idle for more than a second before handing it
	// out.
	pingTimeout = 5 * time.Second
	// ListenCheck is how often the listener checks its connection when no
	// notification came (SELECT 1 on it, bounded by ListenCheck too): a
	// listening connection that stopped answering is dropped and made
	// again within twice this.
	ListenCheck = 5 * time.Second
)

// How PostgreSQL finds out that a session's client is gone: a session
// whose client vanished without a word (a silent network loss, a node
// frozen or cut off) would otherwise keep its backend, and the locks of
// its transaction, for the server's own TCP timeouts, two hours by
// default on Linux. Open sets these per session when the URL does not,
// on the servers that know them.
const (
	// serverKeepAliveIdle, serverKeepAliveInterval and
	// serverKeepAliveCount are the session's tcp_keepalives_idle,
	// tcp_keepalives_interval and tcp_keepalives_count, in seconds: the
	// server drops an idle session whose client is gone after at most
	// 10 + 5*3 = 25 seconds.
	serverKeepAliveIdle     = 10
	serverKeepAliveInterval = 5
	serverKeepAliveCount    = 3
	// serverUserTimeout is the session's tcp_user_timeout, in
	// milliseconds: the server drops a session whose sent data stays
	// unacknowledged this long.
	serverUserTimeout = 30_000
	// serverIdleInTransaction is the session's
	// idle_in_transaction_session_timeout, in milliseconds, unless the
	// server, the database or the role sets one: a transaction whose
	// client went silent (a statement or a COMMIT lost on a dead path, a
	// node cut off between two statements) would otherwise hold its locks
	// until the session is dropped, and stop every statement that needs
	// them (the finish of the tasks it had claimed, say). stint's own
	// transactions take milliseconds; a behavior's transaction on the
	// store's pool that waits longer than this between statements is
	// ended by the server.
	serverIdleInTransaction = 10_000
)

// holdIdleTimeout is how long a transaction of stint's that holds what
// other nodes wait for (a claim's turn under flow control, a schedule's
// row, a rate limit's row, the pause and hold lock, a migration's locks)
// may idle between two of its statements before the server ends it,
// whatever the session's idle_in_transaction_session_timeout: a node
// frozen inside one (SIGSTOP, a paused VM, a stuck process) stalls the
// others that long at most, and then loses its session. stint's own
// transactions idle for milliseconds between statements.
const holdIdleTimeout = 2 * time.Second

// holdIdleSQL sets holdIdleTimeout on the transaction it runs in, as a
// column of a SELECT of settings.
var holdIdleSQL = fmt.Sprintf(`set_config('idle_in_transaction_session_timeout', '%d', true)`, holdIdleTimeout.Milliseconds())

// holdingTx runs fn in a transaction whose first statement sets
// holdIdleTimeout: a transaction that holds what other nodes wait for.
func holdingTx(ctx context.Context, db *pgxpool.Pool, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT `+holdIdleSQL); err != nil {
			return err
		}
		return fn(tx)
	})
}

// serverSettings are the settings above, by name, and jit.
var serverSettings = map[string]string{
	"tcp_keepalives_idle":     fmt.Sprint(serverKeepAliveIdle),
	"tcp_keepalives_interval": fmt.Sprint(serverKeepAliveInterval),
	"tcp_keepalives_count":    fmt.Sprint(serverKeepAliveCount),
	"tcp_user_timeout":        fmt.Sprint(serverUserTimeout),
	// Only when nothing else set it: see serverIdleInTransaction.
	"idle_in_transaction_session_timeout": fmt.Sprint(serverIdleInTransaction),
	// No JIT compilation: it starts when a statement's estimated cost is
	// high, which a queue table's stale statistics make common, and its
	// compile alone took 150 ms of a statement that reads a workflow's
	// 10,000 nodes in a tenth of that.
	"jit": "off",
}

// setServerTimeouts sets on conn's session the settings of serverSettings
// that its URL did not set (those are in runtime), skipping those the
// server does not know, and idle_in_transaction_session_timeout when the
// session has one already. It takes a statement rather than the startup
// message, which PgBouncer refuses when it carries parameters it does not
// know.
func setServerTimeouts(ctx context.Context, conn *pgx.Conn, runtime map[string]string) error {
	var names, values []string
	for name, value := range serverSettings {
		if _, ok := runtime[name]; !ok {
			names, values = append(names, name), append(values, value)
		}
	}
	if len(names) == 0 {
		return nil
	}
	if _, err := conn.Exec(ctx, setServerTimeoutsSQL, names, values); err != nil {
		return fmt.Errorf("set the session's timeouts: %w", err)
	}
	return nil
}

const setServerTimeoutsSQL = `SELECT count(set_config(u.name, u.value, false))
	FROM unnest($1::text[], $2::text[]) AS u(name, value)
	WHERE u.name IN (SELECT name FROM pg_settings
	    WHERE name <> 'idle_in_transaction_session_timeout' OR setting = '0')`

// deadConnAfter is how long after the database stopped answering (see
// ResetConnections) a pooled connection that has waited for an answer
// since, and got none, is closed: after a silent network loss the
// statement in flight on it would otherwise wait for its own deadline, or
// forever when it has none (a behavior's own statement, or a transaction
// holding the connection), and keep the pool's slot all that time.
const deadConnAfter = 5 * time.Second

// closeGrace is how long Close lets the pools close their connections
// cleanly before it closes their sockets.
const closeGrace = 2 * time.Second

// errStoreClosed is a connection attempt after Close.
var errStoreClosed = errors.New("the store is closed")

// sockets tracks the sockets of a store's connections, so that the ones a
// silent network loss left dead can be closed (sweep) and Close can end
// whatever state they are in (abort). A socket closed under a statement
// fails it at once.
type sockets struct {
	mu      sync.Mutex
	open    map[*socket]struct{}
	aborted bool
}

func newSockets() *sockets { return &sockets{open: map[*socket]struct{}{}} }

// socket is a connection's net.Conn, with what sweep needs to know.
type socket struct {
	net.Conn
	set *sockets
	// pooled is false for the listener's connection, which waits for
	// notifications for as long as none come and checks itself.
	pooled bool
	born   time.Time
	// busy counts the reads and writes in progress; heard is when the
	// last byte came (UnixNano).
	busy  atomic.Int32
	heard atomic.Int64
	// moved counts the bytes read and written since the pool last took
	// the connection back (see trimOnRelease).
	moved atomic.Int64
}

func (c *socket) Read(b []byte) (int, error) {
	c.busy.Add(1)
	n, err := c.Conn.Read(b)
	c.busy.Add(-1)
	if n > 0 {
		c.heard.Store(time.Now().UnixNano())
		c.moved.Add(int64(n))
	}
	return n, err
}

func (c *socket) Write(b []byte) (int, error) {
	c.busy.Add(1)
	defer c.busy.Add(-1)
	n, err := c.Conn.Write(b)
	c.moved.Add(int64(n))
	return n, err
}

// socketOf returns the socket under a connection's net.Conn (TLS wraps
// it), or nil.
func socketOf(c net.Conn) *socket {
	for {
		switch x := c.(type) {
		case *socket:
			return x
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		default:
			return nil
		}
	}
}

// trimAfter is how many bytes a pooled connection may read and write
// between two of its releases before its release trims its buffers.
const trimAfter = 1 << 20

// trimParams is how many parameters the statement that trims a
// connection's buffers takes (trimSQL): pgx keeps the slots of up to as
// many parameters from one statement to the next, each pointing into the
// encoded parameters of the statement that filled it last.
const trimParams = 64

// trimSQL is the statement that trims a connection's buffers: trimParams
// small parameters, one small row.
var trimSQL = func() string {
	var b strings.Builder
	b.WriteString("SELECT ARRAY[")
	for i := range trimParams {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "$%d::int", i+1)
	}
	b.WriteString("]")
	return b.String()
}()

// trimArgs are trimSQL's arguments.
var trimArgs = make([]any, trimParams)

func init() {
	for i := range trimArgs {
		trimArgs[i] = int32(0)
	}
}

// trimOnRelease trims the buffers of a connection that read or wrote
// more than trimAfter since its last release, as the pool takes it back:
// pgx keeps the encoded parameters of a connection's last statement, and
// the buffer of its last big message read, until its next statement, and
// each connection of a pool kept the last batch of big results it had
// sent (a batch of 200 results of a megabyte, 200 MB): a node's heap grew
// round after round of big tasks by as much per connection. A statement
// of small parameters (trimSQL) replaces both buffers with small ones, and
// every slot of a parameter. It runs in Release, in the releasing
// goroutine (see releaseTrimmer), on a connection the pool will keep: a
// pool's AfterRelease would do it in a goroutine of its own for every
// release, and a released connection would not be back in the pool when
// Release returns.
func trimOnRelease(conn *pgx.Conn) {
	sock := socketOf(conn.PgConn().Conn())
	if sock == nil || sock.moved.Swap(0) <= trimAfter {
		return
	}
	if conn.IsClosed() || conn.PgConn().IsBusy() || conn.PgConn().TxStatus() != 'I' {
		return // the pool drops it
	}
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, trimSQL, trimArgs...); err != nil {
		_ = conn.Close(ctx) // the pool drops a closed connection
	}
	sock.moved.Store(0)
}

func (c *socket) Close() error {
	c.set.mu.Lock()
	delete(c.set.open, c)
	c.set.mu.Unlock()
	return c.Conn.Close()
}

// add tracks c, unless the set was aborted.
func (s *sockets) add(c *socket) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aborted {
		return false
	}
	s.open[c] = struct{}{}
	return true
}

// sweep closes the pooled sockets made before since that are reading or
// writing and have heard nothing from the server since: they wait for an
// answer that a live connection would have given by now.
func (s *sockets) sweep(since time.Time) int {
	s.mu.Lock()
	var dead []*socket
	for c := range s.open {
		if c.pooled && c.born.Before(since) && c.busy.Load() > 0 && c.heard.Load() < since.UnixNano() {
			dead = append(dead, c)
		}
	}
	s.mu.Unlock()
	for _, c := range dead {
		_ = c.Close()
	}
	return len(dead)
}

// abort refuses new connections and closes every socket.
func (s *sockets) abort() {
	s.mu.Lock()
	s.aborted = true
	all := make([]*socket, 0, len(s.open))
	for c := range s.open {
		all = append(all, c)
	}
	s.mu.Unlock()
	for _, c := range all {
		_ = c.Close()
	}
}

// dialer makes every connection with TCP keepalives and TCP_USER_TIMEOUT
// (see above), bounded by timeout, and tracks its socket in s; pooled is
// false for the listener's connections.
func (s *sockets) dialer(timeout time.Duration, pooled bool) pgconn.DialFunc {
	d := &net.Dialer{
		Timeout: timeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount,
		},
		Control: func(network, _ string, c syscall.RawConn) error {
			if network != "tcp" && network != "tcp4" && network != "tcp6" {
				return nil // a Unix socket has no TCP options
			}
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(userTimeout.Milliseconds()))
			})
			return errors.Join(err, serr)
		},
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		s.mu.Lock()
		aborted := s.aborted
		s.mu.Unlock()
		if aborted {
			return nil, errStoreClosed
		}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := &socket{Conn: conn, set: s, pooled: pooled, born: time.Now()}
		if !s.add(c) {
			_ = conn.Close()
			return nil, errStoreClosed
		}
		return c, nil
	}
}

// guardConnConfig sets the dialer and the connect timeout of cfg (and of
// its fallbacks, the other hosts of a multi-host URL).
func (s *sockets) guardConnConfig(cfg *pgconn.Config, pooled bool) {
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = ConnectTimeout
	}
	cfg.DialFunc = s.dialer(cfg.ConnectTimeout, pooled)
}

// guardPoolConfig applies guardConnConfig to a pool's connections, bounds
// the ping of an idle connection, trims the buffers of a connection that
// moved much data when it is released (trimOnRelease, through the
// connections' tracer), and sets the server's timeouts of each new
// session (setServerTimeouts) before cfg's AfterConnect, if any.
func (s *sockets) guardPoolConfig(cfg *pgxpool.Config) {
	s.guardConnConfig(&cfg.ConnConfig.Config, true)
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = pingTimeout
	}
	cfg.ConnConfig.Tracer = releaseTrimmer{cfg.ConnConfig.Tracer}
	runtime, after := cfg.ConnConfig.RuntimeParams, cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if err := setServerTimeouts(ctx, conn, runtime); err != nil {
			return err
		}
		if after != nil {
			return after(ctx, conn)
		}
		return nil
	}
}

// ResetConnections checks the pools' idle connections at once, dropping
// those that do not answer a ping within idleCheck, and closes the
// connections that wait for an answer since and got none deadConnAfter
// later, failing their statements. The engine calls it when the database
// stops answering: after a silent network loss every pooled connection
// may be dead, and each would cost a statement its deadline before the
// pool found out. Connections that answer are kept: dropping them all
// would make the next statements connect afresh, and a statement with a
// tight deadline (a lease renewal) that missed it for the connection's
// set-up would start the next incident, and the next reset.
func (s *Store) ResetConnections() {
	since := time.Now()
	go checkIdle(s.pool)
	go checkIdle(s.lease)
	if s.read != nil {
		go checkIdle(s.read)
	}
	time.AfterFunc(deadConnAfter, func() { s.sockets.sweep(since) })
}

// idleCheck bounds the ping of each idle connection ResetConnections
// checks.
const idleCheck = 2 * time.Second

// checkIdle pings every idle connection of pool at once, and drops those
// that do not answer within idleCheck.
func checkIdle(pool *pgxpool.Pool) {
	ctx, cancel := context.WithTimeout(context.Background(), idleCheck)
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range pool.AcquireAllIdle(ctx) {
		wg.Go(func() {
			if err := c.Ping(ctx); err != nil {
				// A closed connection is dropped when released; ctx is
				// over, so Close waits for nothing.
				_ = c.Conn().Close(ctx)
			}
			c.Release()
		})
	}
	wg.Wait()
}
