package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
)

// SetProgress replaces the progress of a task that is not running; see
// store.Store.
func (s *Store) SetProgress(ctx context.Context, id api.TaskID, old, progress json.RawMessage, statuses []api.Status) error {
	var oldArg *string
	if len(old) > 0 {
		o := string(old)
		oldArg = &o
	}
	ss := make([]string, len(statuses))
	for i, st := range statuses {
		ss[i] = string(st)
	}
	var status string
	err := s.pool.QueryRow(ctx, `
		WITH u AS (
		    UPDATE stint_task SET progress = $2::jsonb, updated_at = now()
		    WHERE id = $1 AND status = ANY($4) AND status <> 'running' AND progress IS NOT DISTINCT FROM $3::jsonb
		    RETURNING 1)
		SELECT CASE WHEN EXISTS (SELECT 1 FROM u) THEN 'updated' ELSE status::text END
		FROM stint_task WHERE id = $1`,
		string(id), string(progress), oldArg, ss).Scan(&status)
	switch {
	case isNoRows(err):
		return fmt.Errorf("set progress of %s: %w", id, api.ErrNotFound)
	case err != nil:
		return fmt.Errorf("set progress of %s: %w", id, err)
	case status != "updated":
		return fmt.Errorf("set progress of %s: %w: it is %s or its progress changed meanwhile", id, api.ErrConflict, status)
	}
	return nil
}

// CountChildren counts the children of behavior of the parents; see
// store.Store.
func (s *Store) CountChildren(ctx context.Context, parents []api.TaskID, behavior api.BehaviorID, progressField string) ([]api.ChildCount, error) {
	ids := make([]string, len(parents))
	for i, p := range parents {
		ids[i] = string(p)
	}
	rows, err := s.pool.Query(ctx, `
		SELECT parent_id, status, schedule_not_before IS NOT NULL OR resubmit, coalesce(group_key, ''),
		    coalesce(progress->>$3, ''), count(*)
		FROM stint_task WHERE parent_id = ANY($1) AND behavior = $2
		GROUP BY 1, 2, 3, 4, 5`, ids, string(behavior), progressField)
	if err != nil {
		return nil, fmt.Errorf("count children: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (api.ChildCount, error) {
		var c api.ChildCount
		err := row.Scan(&c.ParentID, &c.Status, &c.Waiting, &c.GroupKey, &c.ProgressValue, &c.N)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count children: %w", err)
	}
	return out, nil
}
