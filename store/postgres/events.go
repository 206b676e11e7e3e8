package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// A task's events are its rows of stint_event whose created is the task's
// created_at (see migrations/0031_events.up.sql).

// setEventSQL sets the event $3 of task $1 to $4 under the lease $2: only
// while the lease holds the running task, which it locks (a finish of the
// run waits for the statement's transaction, so that an event set is
// never lost to a finish nor the other way). It notifies the task's
// awaiters, which read the event.
var setEventSQL = `
WITH t AS (
    SELECT id, created_at FROM stint_task WHERE id = $1 AND lease = $2 AND status = 'running' FOR SHARE
), e AS (
    INSERT INTO stint_event (task_id, key, value, at, created)
    SELECT id, $3, $4::jsonb, statement_timestamp(), created_at FROM t
    ON CONFLICT (task_id, key) DO UPDATE SET value = excluded.value, at = excluded.at, created = excluded.created
    RETURNING task_id
)
SELECT count(pg_notify('` + store.ChannelFinished + `', task_id)) FROM e`

// eventsSQL reads the events of task $1, only that of key $2 unless it
// is empty.
const eventsSQL = `SELECT e.key, e.value, e.at FROM stint_event e JOIN stint_task t ON t.id = e.task_id AND t.created_at = e.created
WHERE e.task_id = $1 AND ($2 = '' OR e.key = $2)
ORDER BY e.key`

// eventsOfDeleted is the CTE of the statements that delete finished tasks
// (d) and their workflows' nodes (nodes) that deletes their events.
const eventsOfDeleted = `
    DELETE FROM stint_event v WHERE v.task_id = ANY(ARRAY(SELECT id FROM d UNION ALL SELECT id FROM nodes))`

// eventsDelete returns the statement that deletes the events of the tasks
// whose ids the array expression ids holds, found by the primary key.
func eventsDelete(ids string) string {
	return `DELETE FROM stint_event v WHERE v.task_id = ANY(` + ids + `)`
}

// SetEvent sets an event of a running task; see store.Store.
func (s *Store) SetEvent(ctx context.Context, tx pgx.Tx, r store.LeaseRef, key string, value json.RawMessage) error {
	var db querier = s.pool
	if tx != nil {
		db = tx
	}
	var n int
	if err := db.QueryRow(ctx, setEventSQL, string(r.ID), uuid(r.Lease), key, string(value)).Scan(&n); err != nil {
		return fmt.Errorf("set event %q of task %s: %w", key, r.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("set event %q of task %s: %w", key, r.ID, api.ErrHalt)
	}
	return nil
}

// Events returns the events of a task; see store.Store.
func (s *Store) Events(ctx context.Context, id api.TaskID, key string) ([]api.TaskEvent, error) {
	rows, err := s.pool.Query(ctx, eventsSQL, string(id), key)
	if err != nil {
		return nil, fmt.Errorf("read events of task %s: %w", id, err)
	}
	var out []api.TaskEvent
	var e api.TaskEvent
	var value []byte
	if _, err := pgx.ForEachRow(rows, []any{&e.Key, &value, &e.At}, func() error {
		e.Value = append(json.RawMessage(nil), value...)
		out = append(out, e)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read events of task %s: %w", id, err)
	}
	return out, nil
}
