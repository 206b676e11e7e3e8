package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
)

// RecentChanges returns the latest limit changes of the feed, newest
// first, by sequence number. It reads the newest rows of the feed only,
// for a view of recent activity; a reader that must miss nothing follows
// ticks with Changes.
func (s *Store) RecentChanges(ctx context.Context, limit int) ([]api.Event, error) {
	if limit <= 0 {
		return nil, nil
	}
	var out []api.Event
	err := s.reading(ctx, func(db *pgxpool.Pool, _ bool) error {
		var err error
		out, err = recentChanges(ctx, db, limit)
		return err
	})
	return out, err
}

// recentChanges reads the latest limit changes on db.
func recentChanges(ctx context.Context, db *pgxpool.Pool, limit int) ([]api.Event, error) {
	rows, err := db.Query(ctx, `
		SELECT c.seq, u.task_id, u.behavior, u.status, coalesce(u.parent_id, ''), u.final, c.at
		FROM (SELECT * FROM stint_change ORDER BY seq DESC LIMIT $1) c,
		     unnest(c.task_ids, c.behaviors, c.statuses, c.parent_ids, c.finals) WITH ORDINALITY
		         AS u(task_id, behavior, status, parent_id, final, pos)
		ORDER BY c.seq DESC, u.pos DESC
		LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("read recent changes: %w", err)
	}
	var out []api.Event
	var e api.Event
	if _, err := pgx.ForEachRow(rows, []any{&e.Seq, &e.TaskID, &e.Behavior, &e.Status, &e.ParentID, &e.Final, &e.At}, func() error {
		out = append(out, e)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read recent changes: %w", err)
	}
	return out, nil
}
