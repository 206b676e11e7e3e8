package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/store"
)

// A hot standby serves the reads that may lag: Get, List, Stats, Changes,
// RecentChanges and FeedConsumers. Everything else stays on the primary:
// every write and claim, lease renewals, LISTEN and NOTIFY, the feed's
// ticks (FeedHead writes one), and the reads the engine decides on
// (PendingCount, Behaviors, Schedules, QueueLag, CountChildren, HeldGroups,
// Nodes, whose health is judged by heartbeat ages that a lagging standby
// would age falsely).
//
// A standby lags: it shows the database as the primary had it a moment
// ago. Where the lag would turn into a wrong answer rather than an old
// one, the read goes to the primary:
//
//   - Get of a task the standby does not have asks the primary, so a Get
//     right after a Submit finds the task.
//   - Changes after a cursor (a feed tick) the standby has not replayed yet
//     reads on the primary, so a cursor from FeedHead is never "not in the
//     feed".
//   - A read under store.ReadPrimary goes to the primary.
//   - A read the standby cannot serve (it is down, restarting, or it
//     cancelled the statement for a conflict with recovery) is retried on
//     the primary.

// ReadDSN sends the reads that may lag to a hot standby of the primary at
// dsn (a streaming replica, or a pooler in front of replicas); see the
// rules above. Open connects to it and fails when it cannot; later, reads
// fall back to the primary while the standby is unreachable. The standby
// must replicate the whole primary (physical replication): a logical
// replica that lacks a stint table fails the reads. An empty dsn keeps
// every read on the primary.
func ReadDSN(dsn string) Option { return func(o *options) { o.readDSN = dsn } }

// openReadPool opens the pool of the standby at dsn, with the primary's
// pool size.
func openReadPool(ctx context.Context, dsn string, maxConns int32, socks *sockets) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse read database URL: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	socks.guardPoolConfig(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("read database: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("read database: connect: %w", err)
	}
	return pool, nil
}

// HasStandby reports whether the store sends reads to a standby.
func (s *Store) HasStandby() bool { return s.read != nil }

// reading runs the read fn on the standby, or on the primary when there is
// no standby or ctx asks for the primary (store.ReadPrimary). A read the
// standby cannot serve is run again on the primary. fn is told whether it
// runs on the standby, and must keep no state from a failed call.
func (s *Store) reading(ctx context.Context, fn func(db *pgxpool.Pool, standby bool) error) error {
	if s.read == nil || store.ReadsPrimary(ctx) {
		return fn(s.pool, false)
	}
	err := fn(s.read, true)
	if err != nil && ctx.Err() == nil && standbyUnavailable(err) {
		return fn(s.pool, false)
	}
	return err
}

// standbyUnavailable reports whether err means that the standby could not
// serve a read, rather than that the read is wrong: the connection failed,
// the server is shutting down or starting up, or recovery cancelled the
// statement (SQLSTATE 40001 on a standby, 40P01 for a deadlock with
// recovery).
func standbyUnavailable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01", "57P01", "57P02", "57P03":
			return true
		}
		return len(pgErr.Code) == 5 && pgErr.Code[:2] == "08" // connection exception
	}
	// Not an error the server sent: the connection or the network failed.
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) ||
		errors.Is(err, io.ErrUnexpectedEOF)
}
