package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
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

// dial makes every connection with TCP keepalives and TCP_USER_TIMEOUT
// (see above), bounded by timeout.
func dialer(timeout time.Duration) pgconn.DialFunc {
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
	return d.DialContext
}

// guardConnConfig sets the dialer and the connect timeout of cfg (and of
// its fallbacks, the other hosts of a multi-host URL).
func guardConnConfig(cfg *pgconn.Config) {
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = ConnectTimeout
	}
	cfg.DialFunc = dialer(cfg.ConnectTimeout)
}

// guardPoolConfig applies guardConnConfig to a pool's connections and
// bounds the ping of an idle connection.
func guardPoolConfig(cfg *pgxpool.Config) {
	guardConnConfig(&cfg.ConnConfig.Config)
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = pingTimeout
	}
}

// waitNotification waits for a notification on conn, checking the
// connection with SELECT 1 whenever ListenCheck passes without one: a
// connection that does not answer within ListenCheck is an error, and the
// caller makes a new one.
func waitNotification(ctx context.Context, conn *pgx.Conn, check time.Duration) (*pgconn.Notification, error) {
	for {
		wctx, cancel := context.WithTimeout(ctx, check)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err == nil {
			return n, nil
		}
		if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) || conn.IsClosed() {
			return nil, err
		}
		pctx, cancel := context.WithTimeout(ctx, check)
		_, err = conn.Exec(pctx, "SELECT 1")
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("the listening connection did not answer a check within %s: %w", check, err)
		}
	}
}

// ResetConnections closes the pools' idle connections at once, and those
// in use when they are released, so that new ones are made. The engine
// calls it when the database stops answering: after a silent network
// loss every pooled connection may be dead, and each would cost a
// statement its deadline before the pool found out.
func (s *Store) ResetConnections() {
	s.pool.Reset()
	if s.read != nil {
		s.read.Reset()
	}
}
