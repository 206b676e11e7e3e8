package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// A task's messages are its rows of stint_signal whose created is the
// task's created_at (see migrations/0032_signals.up.sql).
//
// No wake is lost between a signal and the finish of a run that sleeps on
// its topic, although each reads the other's rows: a signal locks the
// task's row before it stores the message, and a finish that sleeps
// writes the row before it looks for a message, each in a statement of
// its own, so that the second of the two, whichever it is, sees what the
// first committed (READ COMMITTED takes a snapshot per statement).

// signalLockSQL locks the row of task $1 for a signal and says whether the
// task is finished for good and whether it is a workflow's own task; no
// row when there is no such task.
var signalLockSQL = `SELECT status IN ('success', 'failure') AND schedule_not_before IS NULL AND NOT resubmit,
    behavior = '` + string(api.WorkflowBehavior) + `'
FROM stint_task WHERE id = $1 FOR NO KEY UPDATE`

// signalSQL stores the message $3 of topic $2 with the idempotency key $4
// (NULL for none) for task $1, unless the task finished for good or
// already has a message of the key or is a workflow's own task (whose
// runs receive none), and makes the task due when it
// sleeps on the topic: at once, or, when held, at its release. It returns
// the number of messages stored.
var signalSQL = `
WITH t AS (
    SELECT id, created_at FROM stint_task
    WHERE id = $1 AND NOT (status IN ('success', 'failure') AND schedule_not_before IS NULL AND NOT resubmit)
        AND behavior <> '` + string(api.WorkflowBehavior) + `'
), ins AS (
    INSERT INTO stint_signal (task_id, topic, payload, key, at, created)
    SELECT id, $2, $3::jsonb, $4, statement_timestamp(), created_at FROM t
    ON CONFLICT (task_id, key) WHERE key IS NOT NULL DO NOTHING
    RETURNING task_id
), woken AS (
    UPDATE stint_task k SET
        schedule_not_before = CASE WHEN k.status = 'held' THEN k.schedule_not_before ELSE now() END,
        held_due = CASE WHEN k.status = 'held' THEN now() ELSE k.held_due END,
        signal_wait = NULL,
        updated_at = now()
    WHERE k.id = $1 AND k.signal_wait = $2 AND k.status IN ('scheduled', 'held') AND EXISTS (SELECT 1 FROM ins)
    RETURNING k.id, k.behavior, k.priority, k.schedule_not_before, k.group_key, k.status
), due AS (` + dueInsert("woken") + `
), woke AS (
    SELECT count(pg_notify('` + store.ChannelDue + `', '')) AS n FROM (SELECT 1 FROM woken WHERE status = 'scheduled') w
)
SELECT (SELECT count(*) FROM ins) FROM woke`

// signalWakeSQL makes due at once the tasks of $1 that a finish put to
// sleep on a topic of which a message waits unconsumed. It runs after the
// finish, in its transaction (see the rule above).
var signalWakeSQL = `
WITH w AS (
    UPDATE stint_task t SET schedule_not_before = now(), signal_wait = NULL
    WHERE t.id = ANY($1::text[]) AND t.status = 'scheduled' AND t.signal_wait IS NOT NULL
        AND EXISTS (SELECT 1 FROM stint_signal s WHERE s.task_id = t.id AND s.topic = t.signal_wait
            AND s.consumed_at IS NULL AND s.created = t.created_at)
    RETURNING t.id, t.behavior, t.priority, t.schedule_not_before, t.group_key, t.status
), due AS (` + dueInsert("w") + `
)
SELECT count(pg_notify('` + store.ChannelDue + `', '')) FROM (SELECT 1 FROM w LIMIT 1) n`

// signalsConsumed is the CTE of finishSQL that records as consumed the
// messages whose task and seq the arrays $8 and $9 pair, of the tasks
// whose completion the statement recorded (done).
const signalsConsumed = `
    UPDATE stint_signal s SET consumed_at = now()
    FROM (SELECT unnest($8::text[]) AS id, unnest($9::bigint[]) AS seq) x
    WHERE s.task_id = x.id AND s.seq = x.seq AND s.consumed_at IS NULL
        AND x.id = ANY(ARRAY(SELECT id FROM done))`

// signalColumns are the columns scanSignal reads, of stint_signal s
// joined to its task t.
const signalColumns = `s.seq, s.topic, s.payload, coalesce(s.key, ''), s.at
FROM stint_signal s JOIN stint_task t ON t.id = s.task_id AND t.created_at = s.created`

// receiveSQL reads the oldest message of topic $2 for task $1 that no run
// consumed and whose seq is over $3.
const receiveSQL = `SELECT ` + signalColumns + `
WHERE s.task_id = $1 AND s.topic = $2 AND s.consumed_at IS NULL AND s.seq > $3
ORDER BY s.seq LIMIT 1`

// signalsSQL reads the messages of task $1 that no run consumed.
const signalsSQL = `SELECT ` + signalColumns + `
WHERE s.task_id = $1 AND s.consumed_at IS NULL ORDER BY s.seq`

// signalsOfDeleted is the CTE of the statements that delete finished
// tasks (d) and their workflows' nodes (nodes) that deletes their
// messages.
const signalsOfDeleted = `
    DELETE FROM stint_signal s WHERE s.task_id = ANY(ARRAY(SELECT id FROM d UNION ALL SELECT id FROM nodes))`

// signalsDelete returns the statement that deletes the messages of the
// tasks whose ids the array expression ids holds.
func signalsDelete(ids string) string {
	return `DELETE FROM stint_signal s WHERE s.task_id = ANY(` + ids + `)`
}

// Signal stores a message for a task; see store.Store.
func (s *Store) Signal(ctx context.Context, tx pgx.Tx, id api.TaskID, topic string, payload json.RawMessage, key string) (bool, error) {
	var (
		found, finished, workflow bool
		stored                    int
	)
	run := func(q batcher) error {
		b := &pgx.Batch{}
		b.Queue(signalLockSQL, string(id)).QueryRow(func(r pgx.Row) error {
			err := r.Scan(&finished, &workflow)
			found = err == nil
			if isNoRows(err) {
				err = nil
			}
			return err
		})
		b.Queue(signalSQL, string(id), topic, string(payload), pgtype.Text{String: key, Valid: key != ""}).QueryRow(func(r pgx.Row) error {
			return r.Scan(&stored)
		})
		return q.SendBatch(ctx, b).Close()
	}
	var err error
	if tx != nil {
		err = run(tx)
	} else {
		err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return run(tx) })
	}
	switch {
	case err != nil:
		return false, fmt.Errorf("signal task %s: %w", id, err)
	case !found:
		return false, fmt.Errorf("signal task %s: %w", id, api.ErrNotFound)
	case finished:
		return false, fmt.Errorf("signal task %s: it has finished: %w", id, api.ErrConflict)
	case workflow:
		return false, fmt.Errorf("signal task %s: a workflow's own task receives no signals (signal one of its nodes): %w", id, api.ErrConflict)
	}
	return stored > 0, nil
}

// Receive returns a message of a task; see store.Store.
func (s *Store) Receive(ctx context.Context, id api.TaskID, topic string, after int64) (api.Signal, bool, error) {
	sg, err := scanSignal(s.pool.QueryRow(ctx, receiveSQL, string(id), topic, after))
	if isNoRows(err) {
		return api.Signal{}, false, nil
	}
	if err != nil {
		return api.Signal{}, false, fmt.Errorf("receive %s of task %s: %w", topic, id, err)
	}
	return sg, true, nil
}

// Signals returns the messages of a task no run consumed; see store.Store.
func (s *Store) Signals(ctx context.Context, id api.TaskID) ([]api.Signal, error) {
	rows, err := s.pool.Query(ctx, signalsSQL, string(id))
	if err != nil {
		return nil, fmt.Errorf("read signals of task %s: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.Signal, error) { return scanSignal(r) })
	if err != nil {
		return nil, fmt.Errorf("read signals of task %s: %w", id, err)
	}
	return out, nil
}

func scanSignal(r pgx.Row) (api.Signal, error) {
	var sg api.Signal
	var payload []byte
	if err := r.Scan(&sg.Seq, &sg.Topic, &payload, &sg.Key, &sg.At); err != nil {
		return api.Signal{}, err
	}
	sg.Payload = append(json.RawMessage(nil), payload...)
	return sg, nil
}
