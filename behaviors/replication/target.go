package replication

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// connect opens a connection to dsn named appName (application_name), within
// timeout.
func connect(ctx context.Context, dsn, appName string, timeout time.Duration) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse connection string: %s", redactError(err, dsn))
	}
	cfg.RuntimeParams["application_name"] = appName
	// Both ends of a COPY in text format must agree on the formats.
	for k, v := range map[string]string{"datestyle": "ISO, YMD", "intervalstyle": "postgres", "timezone": "UTC",
		"extra_float_digits": "3", "bytea_output": "hex"} {
		cfg.RuntimeParams[k] = v
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %s", mustIdentity(dsn), redactError(err, dsn))
	}
	return conn, nil
}

// databaseIdentity names the database q is connected to across clusters:
// the cluster's system identifier and the database's oid.
func databaseIdentity(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (string, error) {
	var id string
	err := q.QueryRow(ctx, `SELECT s.system_identifier::text || '/' || d.oid::text
		FROM pg_control_system() s, pg_database d WHERE d.datname = current_database()`).Scan(&id)
	if err != nil {
		return "", fmt.Errorf("identify database: %w", err)
	}
	return id, nil
}

// appName returns the application_name of the connection that holds a run's
// replication lock: it tells whether the run is persistent and names its
// task, so that a colliding run can tell who holds the lock.
func appName(id api.TaskID, persistent bool) string {
	prefix := "stint:t:"
	if persistent {
		prefix = "stint:p:"
	}
	if len(prefix)+len(id) <= maxIdentifier {
		return prefix + string(id)
	}
	h := sha256.Sum256([]byte(id))
	return prefix + "#" + hex.EncodeToString(h[:12])
}

// holder is the run that holds a replication lock.
type holder struct {
	persistent bool
	// task is the holder's task id, or "#hash" for an id too long for an
	// application_name.
	task string
	pid  int32
}

// parseAppName reads an appName; ok is false for other connections.
func parseAppName(s string) (h holder, ok bool) {
	switch {
	case strings.HasPrefix(s, "stint:t:"):
		return holder{task: s[len("stint:t:"):]}, true
	case strings.HasPrefix(s, "stint:p:"):
		return holder{persistent: true, task: s[len("stint:p:"):]}, true
	}
	return h, false
}

// lockKey is the advisory lock key of a replication id.
func lockKey(replicationID string) int64 {
	h := sha256.Sum256([]byte("stint.replication:" + replicationID))
	return int64(binary.BigEndian.Uint64(h[:8]))
}

// target writes a replication's target table over one connection, which
// holds the replication's lock for the whole run: no other run writes the
// target for this replication while it does.
type target struct {
	conn *pgx.Conn
	plan *plan
	self string // this run's appName
}

// errLockBusy is a lock that stayed held by a run of the same task.
var errLockBusy = errors.New("the replication lock stays held by an older run of this task")

// lockWait bounds how long lock waits for an older run of the same task to
// let go of the lock.
const lockWait = 10 * time.Second

// lock takes the replication's lock on the target database, a session
// advisory lock keyed by the replication id. It returns the holder when
// another replication holds it. A lock held by an older run of this same
// task (its node lost the lease but not its connection, or is closing it)
// is taken over by terminating that run's backend, which also ends any
// write it still had in flight.
func (t *target) lock(ctx context.Context, replicationID string) (*holder, error) {
	key := lockKey(replicationID)
	hi, lo := int64(uint64(key)>>32), int64(uint64(key)&0xffffffff)
	deadline := time.Now().Add(lockWait)
	terminated := map[int32]bool{}
	for {
		var ok bool
		if err := t.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil {
			return nil, fmt.Errorf("take the replication lock: %w", err)
		}
		if ok {
			return nil, nil
		}
		if time.Now().After(deadline) {
			return nil, errLockBusy
		}
		var pid int32
		var name string
		err := t.conn.QueryRow(ctx, `
			SELECT l.pid, coalesce(a.application_name, '')
			FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
			  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid
			LIMIT 1`, hi, lo).Scan(&pid, &name)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // released in between: try again
		case err != nil:
			return nil, fmt.Errorf("find the holder of the replication lock: %w", err)
		case name != t.self:
			h, ok := parseAppName(name)
			if !ok {
				h = holder{task: fmt.Sprintf("(a connection named %q)", name)}
			}
			h.pid = pid
			return &h, nil
		case !terminated[pid]:
			terminated[pid] = true
			if _, err := t.conn.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
				return nil, fmt.Errorf("end the older run of this replication (backend %d): %w", pid, err)
			}
		}
		if err := spi.Sleep(ctx, 20*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// prepare creates the session's batch table.
func (t *target) prepare(ctx context.Context) error {
	if _, err := t.conn.Exec(ctx, t.plan.tempSQL); err != nil {
		return fmt.Errorf("create the batch table: %w", err)
	}
	return nil
}

// write upserts and deletes a batch's rows in one transaction. checkpoint,
// when set, runs in that transaction before it commits (the shared layout),
// with the counts of rows written and deleted.
func (t *target) write(ctx context.Context, b batch, hook func(string), checkpoint func(tx pgx.Tx, written, deleted int64) error) (written, deleted int64, err error) {
	tx, err := t.conn.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("begin the target transaction: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if _, err := t.conn.PgConn().CopyFrom(ctx, bytes.NewReader(b.data), t.plan.copyInSQL); err != nil {
		return 0, 0, fmt.Errorf("load %d rows into the target: %w", b.count, err)
	}
	tag, err := tx.Exec(ctx, t.plan.upsertSQL)
	if err != nil {
		return 0, 0, fmt.Errorf("upsert %d rows into the target: %w", b.count, err)
	}
	written = tag.RowsAffected()
	tag, err = tx.Exec(ctx, t.plan.deleteSQL)
	if err != nil {
		return 0, 0, fmt.Errorf("delete tombstoned rows from the target: %w", err)
	}
	deleted = tag.RowsAffected()
	hook("batch-written")
	if checkpoint != nil {
		if err := checkpoint(tx, written, deleted); err != nil {
			return 0, 0, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, fmt.Errorf("commit the target transaction: %w", err)
	}
	return written, deleted, nil
}
