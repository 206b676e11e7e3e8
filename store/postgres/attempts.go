package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
)

// attemptsSQL reads the failed runs recorded for task $1, by attempt, by
// the primary key.
const attemptsSQL = `SELECT attempt, coalesce(node, ''), started_at, ended_at, error
	FROM stint_attempt WHERE task_id = $1 ORDER BY attempt`

// attemptsInsert is the CTE of finishSQL that records the failed runs of
// done (its CTE of the finished rows) in stint_attempt, over rows left from
// before the task's attempts started over.
const attemptsInsert = `
    INSERT INTO stint_attempt (task_id, attempt, node, started_at, ended_at, error)
    SELECT id, attempt, run_node, executed_at, now(), run_error::jsonb FROM done WHERE run_failed
    ON CONFLICT (task_id, attempt) DO UPDATE SET node = EXCLUDED.node, started_at = EXCLUDED.started_at,
        ended_at = EXCLUDED.ended_at, error = EXCLUDED.error`

// attemptsDelete is the CTE of the statements that delete finished tasks
// (d) and their workflows' nodes (nodes) that deletes their recorded runs.
const attemptsDelete = `
    DELETE FROM stint_attempt a WHERE a.task_id = ANY(ARRAY(SELECT id FROM d UNION ALL SELECT id FROM nodes))`

// Attempts returns the failed runs recorded for a task; see store.Store.
func (s *Store) Attempts(ctx context.Context, id api.TaskID) ([]api.Attempt, error) {
	var out []api.Attempt
	err := s.reading(ctx, func(db *pgxpool.Pool, _ bool) error {
		out = nil
		var a api.Attempt
		var started *time.Time
		var raw []byte
		_, err := indexed(ctx, db, func(rows pgx.Rows) error {
			_, err := pgx.ForEachRow(rows, []any{&a.Attempt, &a.Node, &started, &a.EndedAt, &raw}, func() error {
				a.StartedAt, a.Error = started, nil
				if raw != nil {
					a.Error = new(api.TaskError)
					if err := json.Unmarshal(raw, a.Error); err != nil {
						return fmt.Errorf("decode the error of attempt %d: %w", a.Attempt, err)
					}
				}
				out = append(out, a)
				return nil
			})
			return err
		}, attemptsSQL, string(id))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read attempts of task %s: %w", id, err)
	}
	return out, nil
}
