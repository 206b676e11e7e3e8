package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// The change feed: its reads between ticks, its consumers, and its upkeep.

// Changes reads the change feed from tick f.Since: whole batches between
// ticks, oldest first, until at least f.Limit changes or the newest tick. A
// new tick is made first, so a reader sees what committed before it asked.
// On a standby it sees what the standby has replayed of that; a cursor the
// standby has not replayed yet is read on the primary.
func (s *Store) Changes(ctx context.Context, f store.ChangeFilter) ([]api.Event, int64, error) {
	if f.Limit <= 0 {
		f.Limit = 1000
	}
	if _, err := s.FeedHead(ctx); err != nil {
		return nil, f.Since, err
	}
	var out []api.Event
	cursor := f.Since
	err := s.reading(ctx, func(db *pgxpool.Pool, standby bool) error {
		var err error
		out, cursor, err = readChanges(ctx, db, f)
		if errors.Is(err, errNoTick) && standby {
			out, cursor, err = readChanges(ctx, s.pool, f)
		}
		return err
	})
	if errors.Is(err, errNoTick) {
		return nil, f.Since, api.Invalid("since", "tick %d is not in the feed (expired, or never made)", f.Since)
	}
	return out, cursor, err
}

// errNoTick is readChanges' error for a cursor that is not in the feed.
var errNoTick = errors.New("no such tick")

// readChanges reads the changes after f.Since on db; see Changes.
func readChanges(ctx context.Context, db *pgxpool.Pool, f store.ChangeFilter) ([]api.Event, int64, error) {
	if f.Since > 0 {
		var ok bool
		if err := db.QueryRow(ctx, tickExistsSQL, f.Since).Scan(&ok); err != nil {
			return nil, f.Since, fmt.Errorf("read changes: %w", err)
		}
		if !ok {
			return nil, f.Since, errNoTick
		}
	}
	rows, err := db.Query(ctx, nextTicksSQL, f.Since)
	if err != nil {
		return nil, f.Since, fmt.Errorf("read changes: %w", err)
	}
	ticks, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, f.Since, fmt.Errorf("read changes: %w", err)
	}
	var out []api.Event
	cursor := f.Since
	for _, next := range ticks {
		var e api.Event
		var progress []byte
		if _, err := indexed(ctx, db, func(rows pgx.Rows) error {
			_, err := pgx.ForEachRow(rows, []any{&e.Seq, &e.TaskID, &e.Behavior, &e.Status, &e.ParentID, &e.Final, &e.At, &progress}, func() error {
				e.Progress = progress
				out = append(out, e)
				return nil
			})
			return err
		}, readChangesSQL, cursor, next, string(f.TaskID), string(f.Behavior), string(f.ParentID), string(f.Status)); err != nil {
			return nil, cursor, fmt.Errorf("read changes: %w", err)
		}
		cursor = next
		if len(out) >= f.Limit {
			break
		}
	}
	return out, cursor, nil
}

// The statements of a feed read (a subscription's poll): feedTickSQL
// makes a tick, tickExistsSQL checks the reader's cursor, nextTicksSQL
// lists the ticks after it, and readChangesSQL reads the changes between
// the ticks $1 and $2 that match the filter $3 to $6 (task, behavior,
// parent, status; empty for any). The changes are found by the range of
// transaction ids the two ticks bound (stint_change_xid), and ordered by
// seq + 0: ordered by seq itself, the planner may walk the whole feed in
// the primary key's order to spare a sort of the few changes between two
// ticks.
const (
	feedTickSQL    = `INSERT INTO stint_feed_tick (snap) VALUES (pg_current_snapshot()) RETURNING tick`
	tickExistsSQL  = `SELECT EXISTS (SELECT 1 FROM stint_feed_tick WHERE tick = $1)`
	nextTicksSQL   = `SELECT tick FROM stint_feed_tick WHERE tick > $1 ORDER BY tick LIMIT 100`
	readChangesSQL = `
WITH a AS (SELECT snap FROM stint_feed_tick WHERE tick = $1),
     b AS (SELECT snap FROM stint_feed_tick WHERE tick = $2)
SELECT c.seq, u.task_id, u.behavior, u.status, coalesce(u.parent_id, ''), u.final, c.at,
    c.progresses[u.pos]
FROM stint_change c CROSS JOIN b LEFT JOIN a ON true,
     unnest(c.task_ids, c.behaviors, c.statuses, c.parent_ids, c.finals) WITH ORDINALITY
         AS u(task_id, behavior, status, parent_id, final, pos)
WHERE c.xid < (SELECT pg_snapshot_xmax(snap) FROM stint_feed_tick WHERE tick = $2)
  AND c.xid >= coalesce((SELECT pg_snapshot_xmin(snap) FROM stint_feed_tick WHERE tick = $1), '0'::xid8)
  AND pg_visible_in_snapshot(c.xid, b.snap)
  AND (a.snap IS NULL OR (c.xid >= pg_snapshot_xmin(a.snap) AND NOT pg_visible_in_snapshot(c.xid, a.snap)))
  AND ($3 = '' OR u.task_id = $3) AND ($4 = '' OR u.behavior = $4)
  AND ($5 = '' OR u.parent_id = $5) AND ($6 = '' OR u.status = $6)
ORDER BY c.seq + 0, u.pos`
)

// FeedHead makes a tick and returns it: a reader starting there sees every
// change that commits after the call.
func (s *Store) FeedHead(ctx context.Context) (int64, error) {
	var tick int64
	if err := s.pool.QueryRow(ctx, feedTickSQL).Scan(&tick); err != nil {
		return 0, fmt.Errorf("make feed tick: %w", err)
	}
	return tick, nil
}

// AckFeed registers or renews a feed consumer at tick.
func (s *Store) AckFeed(ctx context.Context, consumer string, tick int64) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO stint_feed_consumer (name, tick) VALUES ($1, $2)
		ON CONFLICT (name) DO UPDATE SET tick = greatest(stint_feed_consumer.tick, $2), heartbeat_at = now()`, consumer, tick)
	if err != nil {
		return fmt.Errorf("ack feed for %q: %w", consumer, err)
	}
	return nil
}

// FeedConsumers lists the feed consumers.
func (s *Store) FeedConsumers(ctx context.Context) ([]store.FeedConsumer, error) {
	var out []store.FeedConsumer
	err := s.reading(ctx, func(db *pgxpool.Pool, _ bool) error {
		rows, err := db.Query(ctx, `SELECT name, tick, heartbeat_at FROM stint_feed_consumer ORDER BY name`)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, pgx.RowToStructByPos[store.FeedConsumer])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list feed consumers: %w", err)
	}
	return out, nil
}

// Maintain drops dead consumers and nodes and trims the feed.
func (s *Store) Maintain(ctx context.Context, p store.MaintainParams) (store.MaintainResult, error) {
	var r store.MaintainResult
	batch := p.Batch
	if batch <= 0 {
		batch = 10000
	}
	err := s.pool.QueryRow(ctx, `
		WITH c AS (DELETE FROM stint_feed_consumer WHERE heartbeat_at < now() - $1 * interval '1 microsecond' RETURNING 1),
		     n AS (DELETE FROM stint_node WHERE heartbeat_at < now() - $2 * interval '1 microsecond' RETURNING 1)
		SELECT (SELECT count(*) FROM c), (SELECT count(*) FROM n)`,
		p.ConsumerTimeout.Microseconds(), p.NodeTimeout.Microseconds()).Scan(&r.Consumers, &r.Nodes)
	if err != nil {
		return r, fmt.Errorf("maintain: %w", err)
	}
	// Changes every live consumer has read (visible in the snapshot of the
	// oldest consumer tick; not "below its xmin": the xmin is held back by
	// any transaction in the cluster) go once past the minimum retention; all go past
	// the maximum. Ticks go with the changes they delimit. Every node trims,
	// often at once: each skips the rows another's trim holds, so that two
	// trims never wait for each other (two deletes of overlapping batches,
	// each locking in its own order, deadlocked).
	tag, err := s.pool.Exec(ctx, `
		WITH keep AS (
		    SELECT snap FROM stint_feed_tick WHERE tick = (SELECT min(tick) FROM stint_feed_consumer))
		DELETE FROM stint_change WHERE seq = ANY(ARRAY(
		    SELECT seq FROM stint_change c
		    WHERE c.at < now() - $1 * interval '1 microsecond'
		      AND (NOT EXISTS (SELECT 1 FROM stint_feed_consumer)
		           OR pg_visible_in_snapshot(c.xid, (SELECT snap FROM keep))
		           OR c.at < now() - $2 * interval '1 microsecond')
		    ORDER BY seq LIMIT $3
		    FOR UPDATE SKIP LOCKED))`,
		p.FeedMinRetention.Microseconds(), p.FeedMaxRetention.Microseconds(), batch)
	if err != nil {
		return r, fmt.Errorf("maintain: trim feed: %w", err)
	}
	if _, err := s.pool.Exec(ctx, `
		DELETE FROM stint_feed_tick WHERE tick = ANY(ARRAY(
		    SELECT tick FROM stint_feed_tick WHERE at < now() - $1 * interval '1 microsecond'
		      AND tick < (SELECT max(tick) FROM stint_feed_tick)
		      AND (tick < coalesce((SELECT min(tick) FROM stint_feed_consumer), 9223372036854775807)
		           OR at < now() - $2 * interval '1 microsecond')
		    ORDER BY tick
		    FOR UPDATE SKIP LOCKED))`,
		p.FeedMinRetention.Microseconds(), p.FeedMaxRetention.Microseconds()); err != nil {
		return r, fmt.Errorf("maintain: trim ticks: %w", err)
	}
	r.Changes = int(tag.RowsAffected())
	return r, nil
}
