// Package postgres implements store.Store on PostgreSQL with pgx.
//
// The hot path is a handful of batched statements: one claims up to N due
// tasks with FOR UPDATE SKIP LOCKED, one renews all of a node's leases, one
// records a batch of completions. Every runner write matches the lease
// token issued by the claim. All times come from the database's now().
//
// The claim takes claim hints from the narrow table stint_due and issues
// one lease row (stint_lease) per claim statement and behavior; the task
// rows themselves get only HOT updates on the hot path, since no index of
// stint_task covers a column that a claim or a finish changes. A node's
// lease keeper renews its lease rows, and every node takes over the tasks
// of expired ones (Takeover). The hints of paused behaviors and held group
// keys are parked, out of the claim index (migration 0012), and the index
// leads with the behavior, so that a claim walks only the hints of the
// behaviors it asks for (migration 0015). See migration 0008 for the
// layout.
//
// With ReadDSN, the reads that may lag go to a hot standby, and everything
// else stays on the primary.
package postgres

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/migrations"
	"github.com/stinthq/stint/store"
)

// Store is the PostgreSQL store.
type Store struct {
	pool *pgxpool.Pool
	// lease is the pool of the statements that keep leases (renewals,
	// takeovers, the node's heartbeat): leaseConns connections of their
	// own, so that a node whose runs' statements fill the main pool
	// (Pool is theirs too) does not make a renewal miss its deadline
	// waiting for a connection, and cut its runs off.
	lease        *pgxpool.Pool
	read         *pgxpool.Pool // the standby's, or nil; see ReadDSN
	listenConfig *pgx.ConnConfig
	noListen     bool
	// sockets are the sockets of the pools' and the listener's
	// connections.
	sockets *sockets
	// answered wakes the listener when the database answers again (see
	// DatabaseAnswered).
	answered *wake
	// lastClaimed is how many tasks the last claim found: the next one's
	// result is sized for as many.
	lastClaimed atomic.Int64
	// fairCursor holds, per behavior, the group key a fair-share claim
	// served last: the next one starts after it.
	fairCursor sync.Map
	// roomCursor holds, per behavior with a cap per group key, the last
	// key a claim read when there were more keys with room than it could
	// take: the next one starts after it (see pickRoom).
	roomCursor sync.Map
	// flowTight holds, per behavior, when a claim under flow control last
	// found a limit binding: see flowLoose.
	flowTight sync.Map
	// flowRates holds, per behavior, the rate keys its last claim tried
	// at once spent: the next one locks them in its first round trip.
	flowRates sync.Map
	// singleDeps is the gate of a node's single dependency in its column
	// (see singleDepsOpen).
	singleDeps singleDepsGate
}

var _ store.Store = (*Store)(nil)

// leaseConns is the size of the pool of the statements that keep leases
// (see Store.lease): a renewal and a takeover or a heartbeat at once.
const leaseConns = 2

// Option configures Open.
type Option func(*options)

type options struct {
	migrate   bool
	maxConns  int32
	listenDSN string
	noListen  bool
	readDSN   string
	tracer    pgx.QueryTracer
}

// Migrate applies pending migrations on Open.
func Migrate() Option { return func(o *options) { o.migrate = true } }

// MaxConns sets the pool size. Defaults to 20: a server uses a few
// connections for claims and completions, and the rest for its runs'
// checkpoints. The statements that keep leases (renewals, takeovers, the
// node's heartbeat) have leaseConns connections of their own besides.
func MaxConns(n int) Option { return func(o *options) { o.maxConns = int32(n) } }

// ListenDSN makes LISTEN use its own connection to dsn. Behind PgBouncer in
// transaction mode, which cannot carry LISTEN, point it straight at
// PostgreSQL while the pool goes through PgBouncer.
func ListenDSN(dsn string) Option { return func(o *options) { o.listenDSN = dsn } }

// PollOnly turns notifications off: claimers and awaiters find work by
// polling alone (ServerConfig.PollInterval, ClientConfig.PollInterval).
// For PgBouncer in transaction mode when no direct connection is possible.
func PollOnly() Option { return func(o *options) { o.noListen = true } }

// Tracer makes t observe every statement the store sends to the primary
// (on its pool's connections and the listening one), as pgx's
// ConnConfig.Tracer does (a span per statement with an
// OpenTelemetry tracer for pgx, or a count of round trips: t may also
// implement pgx.BatchTracer, to see a batch, one round trip, as one).
// By default (nil) nothing observes them.
func Tracer(t pgx.QueryTracer) Option { return func(o *options) { o.tracer = t } }

// Open connects to the database at dsn, a postgres:// URL or key=value
// connection string. An empty dsn is an error (rather than libpq's
// defaults, which hide a missing setting until the first query).
//
// Behind PgBouncer in transaction mode, add default_query_exec_mode=exec
// or simple_protocol to dsn (PgBouncer before 1.21 cannot keep prepared
// statements across transactions) and use ListenDSN or PollOnly.
func Open(ctx context.Context, dsn string, opts ...Option) (*Store, error) {
	if strings.TrimSpace(dsn) == "" {
		return nil, errors.New("open store: the database URL is empty: want postgres://user@host/db or key=value settings")
	}
	o := options{maxConns: 20}
	for _, opt := range opts {
		opt(&o)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("open store: parse database URL: %w", err)
	}
	if o.maxConns > 0 {
		cfg.MaxConns = o.maxConns
	}
	if o.tracer != nil {
		cfg.ConnConfig.Tracer = o.tracer
	}
	socks := newSockets()
	socks.guardPoolConfig(cfg)
	afterConnect := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		registerArrayCodecs(conn.TypeMap())
		if afterConnect != nil {
			return afterConnect(ctx, conn)
		}
		return nil
	}
	leaseCfg := cfg.Copy()
	leaseCfg.MaxConns, leaseCfg.MinConns = leaseConns, 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	leasePool, err := pgxpool.NewWithConfig(ctx, leaseCfg)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("open store: %w", err)
	}
	s := &Store{pool: pool, lease: leasePool, noListen: o.noListen, listenConfig: pool.Config().ConnConfig.Copy(), sockets: socks,
		answered: newWake()}
	closePools := func() { pool.Close(); leasePool.Close() }
	if o.listenDSN != "" {
		if s.listenConfig, err = pgx.ParseConfig(o.listenDSN); err != nil {
			closePools()
			return nil, fmt.Errorf("open store: parse listen URL: %w", err)
		}
	}
	socks.guardConnConfig(&s.listenConfig.Config, false)
	if err := pool.Ping(ctx); err != nil {
		closePools()
		return nil, fmt.Errorf("open store: connect: %s%w", certificateHint(err), err)
	}
	if o.migrate {
		if err := s.Migrate(ctx); err != nil {
			closePools()
			return nil, err
		}
	}
	if strings.TrimSpace(o.readDSN) != "" {
		if s.read, err = openReadPool(ctx, o.readDSN, cfg.MaxConns, socks); err != nil {
			closePools()
			return nil, fmt.Errorf("open store: %w", err)
		}
	}
	return s, nil
}

// Migrate applies pending migrations.
func (s *Store) Migrate(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Release()
	return migrations.Up(ctx, conn.Conn())
}

// Warm opens connections of the pool; see store.Store. Holding n
// connections at once makes the pool open those it lacks; the sessions'
// settings and the warm-up query, which reads the tables and indexes of
// the statements every task passes through, load what a new session
// otherwise loads on its first claim, finish or submit.
func (s *Store) Warm(ctx context.Context, n int) {
	ctx, cancel := context.WithTimeout(ctx, warmWait)
	defer cancel()
	n = max(min(n, int(s.pool.Config().MaxConns)), 0)
	conns := make(chan *pgxpool.Conn, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, err := s.pool.Acquire(ctx)
			if err != nil {
				return
			}
			_, _ = c.Exec(ctx, warmSQL)
			conns <- c
		})
	}
	wg.Wait()
	close(conns)
	for c := range conns {
		c.Release()
	}
}

// warmWait bounds Warm: a database that does not answer is found out by
// the statements that follow, and a start must not wait for it here.
const warmWait = 5 * time.Second

// warmSQL plans a read of the tables a task's statements write, with their
// indexes, and reads nothing.
const warmSQL = `SELECT 1 FROM stint_task t JOIN stint_due d ON d.id = t.id JOIN stint_lease l ON l.lease = t.lease
    JOIN stint_change c ON c.seq = t.attempt WHERE t.id = '' AND d.behavior = '' LIMIT 0`

// Pool returns the primary's connection pool, for behaviors that keep their own
// tables in the same database (see spi.RunContext.CheckpointTx).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close closes the pools, and returns within about twice closeGrace
// whatever state their connections are in: after closeGrace it closes
// every socket of the store's connections (failing the statements in
// flight on them, whose callers then release their connections) and
// refuses new ones; after as long again it returns even if a caller still
// holds a connection, which the pool then closes when it is released.
func (s *Store) Close() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.pool.Close()
		s.lease.Close()
		if s.read != nil {
			s.read.Close()
		}
	}()
	grace := time.NewTimer(closeGrace)
	defer grace.Stop()
	select {
	case <-done:
		return
	case <-grace.C:
	}
	s.sockets.abort()
	grace.Reset(closeGrace)
	select {
	case <-done:
	case <-grace.C:
	}
}

// Notify sends a notification.
func (s *Store) Notify(ctx context.Context, channel, payload string) error {
	if _, err := s.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, payload); err != nil {
		return fmt.Errorf("notify %s: %w", channel, err)
	}
	return nil
}

// isNoRows reports whether err means a query found no row.
func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

// certificateHint says, for a connection refused because the server's
// certificate failed verification (sslmode verify-ca or verify-full),
// what to check; "" for any other error.
func certificateHint(err error) string {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &unknown):
		return "the server's certificate is not signed by a CA that sslrootcert (or, without it, the system) trusts: "
	case errors.As(err, &host):
		return "the server's certificate does not name the host of the URL (sslmode=verify-full): "
	case errors.As(err, &invalid):
		return "the server's certificate is not valid (expired, or not for a server): "
	}
	return ""
}
