package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/store"
)

// Stats reads the task statistics. Counting per behavior and status reads
// the whole task table; the backlog reads the claim hints and the running
// counts the leases, each checked against its task.
//
// On a standby the statistics are as of the data the standby has: their
// clock (Now, by which due ages and expired leases are judged) is the
// commit time of the last transaction it replayed while it has WAL left to
// replay, and now() once it has replayed all it received. So a lagging
// standby shows an older picture, not leases that look expired only
// because their renewals have not arrived yet.
func (s *Store) Stats(ctx context.Context) (store.Stats, error) {
	var st store.Stats
	err := s.reading(ctx, func(db *pgxpool.Pool, _ bool) error {
		var err error
		st, err = readStats(ctx, db)
		return err
	})
	if err != nil {
		return store.Stats{}, fmt.Errorf("read stats: %w", err)
	}
	return st, nil
}

// statsClock is the time the statistics are as of; see Stats.
const statsClock = `SELECT CASE
	WHEN pg_is_in_recovery() AND pg_last_wal_receive_lsn() IS DISTINCT FROM pg_last_wal_replay_lsn()
	THEN least(pg_last_xact_replay_timestamp(), now())
	ELSE now() END`

// readStats reads the statistics on db in one read-only transaction. The
// queries judge ages by $1, the clock of statsClock.
func readStats(ctx context.Context, db *pgxpool.Pool) (store.Stats, error) {
	var st store.Stats
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, statsClock).Scan(&st.Now); err != nil {
			return fmt.Errorf("read the clock: %w", err)
		}
		var err error
		if st.Counts, err = readCounts(ctx, tx); err != nil {
			return err
		}
		if st.Due, err = readDue(ctx, tx, st.Now, true); err != nil {
			return err
		}
		st.Running, err = runningByNode(ctx, tx, st.Now, nil)
		return err
	})
	return st, err
}

// MetricStats reads the statistics the metrics report, in one read-only
// transaction: the tasks per behavior and status (a scan of the task
// table, as for Stats), and the backlog per behavior from the claim hints alone
// (see readDue). Running is left empty.
func (s *Store) MetricStats(ctx context.Context) (store.Stats, error) {
	var st store.Stats
	err := s.reading(ctx, func(db *pgxpool.Pool, _ bool) error {
		return pgx.BeginTxFunc(ctx, db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			st = store.Stats{}
			if err := tx.QueryRow(ctx, statsClock).Scan(&st.Now); err != nil {
				return fmt.Errorf("read the clock: %w", err)
			}
			var err error
			if st.Counts, err = readCounts(ctx, tx); err != nil {
				return err
			}
			st.Due, err = readDue(ctx, tx, st.Now, false)
			return err
		})
	})
	if err != nil {
		return store.Stats{}, fmt.Errorf("read metric stats: %w", err)
	}
	return st, nil
}

// readCounts counts the tasks per behavior and status: a scan of the whole
// task table, whose cost grows with it.
func readCounts(ctx context.Context, tx pgx.Tx) ([]store.StatusCount, error) {
	rows, err := tx.Query(ctx, `SELECT behavior, status, count(*) FROM stint_task GROUP BY behavior, status ORDER BY behavior, status`)
	if err != nil {
		return nil, fmt.Errorf("count tasks: %w", err)
	}
	var counts []store.StatusCount
	var c store.StatusCount
	if _, err := pgx.ForEachRow(rows, []any{&c.Behavior, &c.Status, &c.Count}, func() error {
		counts = append(counts, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count tasks: %w", err)
	}
	return counts, nil
}

// readDue counts the tasks due by now and waiting for a worker, per
// behavior, with the age of the longest-waiting of each: the claim hints
// due by now whose group is not held. It walks the due hints, so its cost
// grows with the backlog, not with the task table. Exact, it counts only
// the hints whose task still matches them; that join took seconds for a
// backlog of a million, so the metrics and the history's samples count
// the hints alone, where a hint made stale by a later change counts until
// a claim drops it (as for QueueLag).
func readDue(ctx context.Context, tx pgx.Tx, now time.Time, exact bool) ([]store.DueCount, error) {
	count, join := "count(*)", ""
	if exact {
		count, join = "count(DISTINCT d.id)", "JOIN stint_task t ON "+hintMatches("t", "d")
	}
	rows, err := tx.Query(ctx, `
		SELECT d.behavior, `+count+`, min(d.due) FROM stint_due d `+join+`
		WHERE d.due <= $1
		  AND (d.group_key IS NULL OR NOT EXISTS (SELECT 1 FROM stint_hold h WHERE h.group_key = d.group_key))
		GROUP BY d.behavior ORDER BY d.behavior`, now)
	if err != nil {
		return nil, fmt.Errorf("count due tasks: %w", err)
	}
	var due []store.DueCount
	var d store.DueCount
	var oldest time.Time
	if _, err := pgx.ForEachRow(rows, []any{&d.Behavior, &d.Count, &oldest}, func() error {
		d.OldestAge = max(now.Sub(oldest), 0)
		due = append(due, d)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count due tasks: %w", err)
	}
	return due, nil
}

// QueueLag returns the age of the oldest due task, by the database clock.
// It reads only the claim hints, so a hint made stale by a later change
// counts until a claim drops it.
func (s *Store) QueueLag(ctx context.Context) (time.Duration, error) {
	var us int64
	err := s.pool.QueryRow(ctx, `
		SELECT coalesce((extract(epoch FROM now() - min(due)) * 1e6)::bigint, 0)
		FROM stint_due WHERE due <= now()`).Scan(&us)
	if err != nil {
		return 0, fmt.Errorf("read queue lag: %w", err)
	}
	return time.Duration(max(us, 0)) * time.Microsecond, nil
}
