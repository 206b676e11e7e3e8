package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// A task's messages are its rows of stint_signal whose created is the
// task's created_at (see migrations/0032_signals.up.sql).
//
// No wake is lost between a signal and the finish of a run that sleeps on
// its topic, although each reads the other's rows: a signal locks the
// task's row before it stores the message (a batch of signals the rows
// of its tasks, signalLock, and stores the messages of those it locked,
// signalSQL), and a finish that sleeps
// writes the row before it looks for a message, each in a statement of
// its own, so that the second of the two, whichever it is, sees what the
// first committed (READ COMMITTED takes a snapshot per statement).

// signalLock returns the statement that locks the rows of the tasks $1
// for signals, one at a time in the order of their ids' bytes (COLLATE
// "C"; the lateral join keeps the order of its outer side), and keeps
// the ids of those it locked for signalSQL in the transaction's setting
// stint.signal_locked. It returns a row per task of $1: its id, whether
// it locked it, whether it finished for good (and a signal does not
// reopen it: signalReopens of the behaviors $2) and whether it is a
// workflow's own task; no row for an id of no task. With skip, it passes
// over the rows another transaction holds (SKIP LOCKED) and never waits:
// a batch of signals that holds some rows and waits for another could
// deadlock with a finish that holds that one and waits for one of
// them, since a finish locks its tasks in its own order.
func signalLock(skip bool) string {
	lock := `FOR NO KEY UPDATE OF t`
	if skip {
		lock += ` SKIP LOCKED`
	}
	return `
WITH l AS MATERIALIZED (
    SELECT x.id, k.id IS NOT NULL AS locked, coalesce(k.finished, false) AS finished, coalesce(k.workflow, false) AS workflow,
        k.id IS NOT NULL OR EXISTS (SELECT 1 FROM stint_task e WHERE e.id = ANY(ARRAY[x.id])) AS found
    FROM (SELECT u.id FROM unnest($1::text[]) AS u(id) GROUP BY u.id ORDER BY u.id COLLATE "C") x
    LEFT JOIN LATERAL (
        SELECT t.id, ` + signalFinished + ` AND NOT ` + signalReopens("$2") + ` AS finished,
            t.behavior = '` + string(api.WorkflowBehavior) + `' AS workflow
        FROM stint_task t WHERE t.id = ANY(ARRAY[x.id]) ` + lock + `
    ) k ON true
), kept AS (
    SELECT set_config('` + signalLockedSetting + `', coalesce(array_agg(id) FILTER (WHERE locked), '{}')::text, true) AS v FROM l
)
SELECT l.id, l.locked, l.finished, l.workflow FROM l WHERE l.found
UNION ALL -- sets the setting, and returns no row
SELECT NULL, false, false, false FROM kept WHERE kept.v IS NULL`
}

// signalFinished is the condition under which the task t finished for
// good, as a signal sees it: it has an outcome and waits for no next run.
const signalFinished = `(` + finishedForGood + ` AND NOT t.resubmit)`

// signalReopens returns the condition under which a signal reopens the
// task t when it finished for good: its behavior is one of the text[]
// parameter behaviors (store.SignalOptions.Reopen), and it is neither a
// workflow's own task nor a node of one (whose runs its workflow
// decides, as for a resubmit: see resubmitRefused), nor a child (whose
// end its parent counted; a signal batch takes no parent's row to count
// it again, as Retry does).
func signalReopens(behaviors string) string {
	return `(t.behavior = ANY(` + behaviors + `::text[]) AND t.workflow_node IS NULL AND t.parent_id IS NULL AND t.behavior <> '` +
		string(api.WorkflowBehavior) + `')`
}

// signalLockedSetting is the setting of a transaction that holds the ids
// of the tasks signalLock locked.
const signalLockedSetting = "stint.signal_locked"

// The statements that lock tasks for signals: waiting for their rows,
// or passing over those another transaction holds.
var (
	signalLockSQL    = signalLock(false)
	signalTryLockSQL = signalLock(true)
)

// signalSQL stores the messages whose tasks, topics, payloads and
// idempotency keys (NULL for none) the arrays $1 to $4 pair, in their
// order, of the tasks that signalLock locked in the transaction (before
// this statement took its snapshot), except those of tasks that
// finished for good (unless signalReopens of the behaviors $6) or are a
// workflow's own task (whose runs receive none), and those whose key the
// task has a message of already (of two of one key, the first). With
// $5, it stores none if it refuses one. It makes each task that sleeps
// on the topic of a message it stored due: at once, or, when held, at
// its release. It reopens each task that finished for good of which it
// stored a message: scheduled and due at once, with the columns a
// resubmit of a finished task resets (see resubmitClause) reset, and a
// change of the feed. It notifies the claimers once if it made a task
// due now, and returns the number of messages stored and of tasks made
// due now.
var signalSQL = `
WITH s AS (
    SELECT * FROM ` + unnestRows("s", "id $1::text[]", "topic $2::text[]", "payload $3::text[]", "key $4::text[]", "ord ordinality") + `
), t AS MATERIALIZED (
    SELECT t.id, t.created_at, ` + signalFinished + ` AS reopen FROM stint_task t
    WHERE t.id = ANY(coalesce(current_setting('` + signalLockedSetting + `', true), '{}')::text[])
        AND (NOT ` + signalFinished + ` OR ` + signalReopens("$6") + `)
        AND t.behavior <> '` + string(api.WorkflowBehavior) + `'
), ins AS (
    INSERT INTO stint_signal (task_id, topic, payload, key, at, created)
    SELECT s.id, s.topic, s.payload::jsonb, s.key, statement_timestamp(), t.created_at
    FROM s JOIN t ON t.id = s.id
    WHERE NOT ($5::boolean AND (SELECT count(*) FROM t) < (SELECT count(DISTINCT id) FROM s))
    ORDER BY s.ord
    ON CONFLICT (task_id, key) WHERE key IS NOT NULL DO NOTHING
    RETURNING task_id, topic
), woken AS (
    UPDATE stint_task k SET
        schedule_not_before = CASE WHEN k.status = 'held' THEN k.schedule_not_before ELSE now() END,
        held_due = CASE WHEN k.status = 'held' THEN now() ELSE k.held_due END,
        signal_wait = NULL,
        updated_at = now()
    FROM (SELECT DISTINCT task_id, topic FROM ins) x
    WHERE k.id = ANY(ARRAY[x.task_id]) AND k.signal_wait = x.topic AND k.status IN ('scheduled', 'held')
    RETURNING k.id, k.behavior, k.priority, k.schedule_not_before, k.group_key, k.status
), reopened AS (
    -- These finished for good (success or failure) and woken's were
    -- scheduled or held: the two updates are disjoint, as they must be
    -- (one statement may not update a row twice). A message whose key
    -- the task has seen is not in ins, and reopens nothing.
    UPDATE stint_task k SET
        status = 'scheduled',
        schedule_not_before = now(),
        attempt = 0,
        errors = 0,
        executed_at = NULL,
        finished_at = NULL,
        updated_at = now()
    FROM (SELECT DISTINCT ins.task_id FROM ins JOIN t ON t.id = ins.task_id WHERE t.reopen) x
    WHERE k.id = ANY(ARRAY[x.task_id])
    RETURNING k.id, k.behavior, k.parent_id, k.priority, k.schedule_not_before, k.group_key, k.status
), made_due AS (
    SELECT id, behavior, priority, schedule_not_before, group_key, status FROM woken
    UNION ALL
    SELECT id, behavior, priority, schedule_not_before, group_key, status FROM reopened
), due AS (` + dueInsert("made_due") + `
), feed AS (` + feedInsert("reopened", "status", "false") + `
), woke AS (
    SELECT count(pg_notify('` + store.ChannelDue + `', '')) AS n FROM (SELECT 1 FROM made_due WHERE status = 'scheduled' LIMIT 1) w
)
SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM made_due WHERE status = 'scheduled') FROM woke`

// signalWakeSQL makes due at once the tasks of $1 that a finish put to
// sleep on a topic of which a message waits unconsumed. It runs after the
// finish, in its transaction (see the rule above).
var signalWakeSQL = `
WITH w AS (
    UPDATE stint_task t SET schedule_not_before = now(), signal_wait = NULL
    WHERE t.id = ANY($1::text[]) AND t.status = 'scheduled' AND t.signal_wait IS NOT NULL
        AND EXISTS (SELECT 1 FROM stint_signal s WHERE s.task_id = t.id AND s.topic = t.signal_wait
            AND s.consumed_at IS NULL AND s.created = t.created_at OFFSET 0)
    RETURNING t.id, t.behavior, t.priority, t.schedule_not_before, t.group_key, t.status
), due AS (` + dueInsert("w") + `
)
SELECT count(pg_notify('` + store.ChannelDue + `', '')) FROM (SELECT 1 FROM w LIMIT 1) n`

// signalsConsumed are the CTEs of finishSQL that consume the messages
// whose task and seq the arrays $8 and $9 pair, of the tasks whose
// completion the statement recorded (done); see consumeSignals.
var signalsConsumed = consumeSignals(`(SELECT unnest($8::text[]) AS id, unnest($9::bigint[]) AS seq) x`,
	`x.id = ANY(ARRAY(SELECT id FROM done))`)

// consumeSignals returns the CTEs that consume the messages of the rows
// of from (an id and a seq, as x) under the condition cond: a message
// without an idempotency key is deleted, since nothing reads it once
// consumed; one with a key is kept, marked consumed, so that a later
// signal with its key stores nothing while the task lives. The first CTE
// is the one being defined (the messages picked), then consumed and
// consumed_keyed. Each message is picked by a probe per row of from (a
// lateral subquery), whatever the statistics say: joined, the planner
// read every pending message and unnested from again for each (2 s for a
// finish of 416 messages).
func consumeSignals(from, cond string) string {
	return `
    SELECT m.ctid, m.keyed FROM ` + from + `, LATERAL (
        SELECT p.ctid, p.key IS NOT NULL AS keyed FROM stint_signal p
        WHERE p.task_id = x.id AND p.seq = x.seq AND p.consumed_at IS NULL OFFSET 0) m
    WHERE ` + cond + `
), consumed AS (
    DELETE FROM stint_signal s WHERE s.ctid = ANY(ARRAY(SELECT ctid FROM consuming WHERE NOT keyed))
), consumed_keyed AS (
    UPDATE stint_signal s SET consumed_at = now() WHERE s.ctid = ANY(ARRAY(SELECT ctid FROM consuming WHERE keyed))`
}

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

// Signal stores messages for tasks; see store.Store.
//
// The statements that lock the tasks and store the messages go in one
// batch, one round trip, which outside a caller's transaction is one
// implicit transaction (no BEGIN and COMMIT of their own). With
// store.SignalPass the lock statement passes over the rows another
// transaction holds (see signalLock). Otherwise it waits for each row in
// turn, and the statements are run again when PostgreSQL ended them to
// break a deadlock, up to deadlockTries times: they stored nothing.
func (s *Store) Signal(ctx context.Context, tx pgx.Tx, sigs []store.NewSignal, opts store.SignalOptions) ([]error, bool, error) {
	if len(sigs) == 0 {
		return nil, false, nil
	}
	pass := opts.Lock == store.SignalPass && tx == nil
	locks, woke, err := s.signalOnce(ctx, tx, sigs, opts, pass)
	for try := 1; err != nil && tx == nil && isDeadlock(err) && try < deadlockTries; try++ {
		locks, woke, err = s.signalOnce(ctx, tx, sigs, opts, pass)
	}
	if err != nil {
		if len(sigs) == 1 {
			return nil, false, fmt.Errorf("signal task %s: %w", sigs[0].ID, err)
		}
		return nil, false, fmt.Errorf("signal %d tasks: %w", len(sigs), err)
	}
	var refused []error
	for i, sg := range sigs {
		l, ok := locks[sg.ID]
		var err error
		switch {
		case !ok:
			err = fmt.Errorf("signal task %s: %w", sg.ID, api.ErrNotFound)
		case !l.locked:
			err = fmt.Errorf("signal task %s: %w", sg.ID, store.ErrBusy)
		case l.finished:
			err = fmt.Errorf("signal task %s: it has finished: %w", sg.ID, api.ErrConflict)
		case l.workflow:
			err = fmt.Errorf("signal task %s: a workflow's own task receives no signals (signal one of its nodes): %w", sg.ID, api.ErrConflict)
		default:
			continue
		}
		if refused == nil {
			refused = make([]error, len(sigs))
		}
		refused[i] = err
	}
	return refused, woke, nil
}

// signalLocked is what signalLock says of a task.
type signalLocked struct{ locked, finished, workflow bool }

// signalOnce runs the statements of Signal once, in tx when not nil, and
// returns what the lock statement said of each task and whether the store
// statement made a task due now.
func (s *Store) signalOnce(ctx context.Context, tx pgx.Tx, sigs []store.NewSignal, opts store.SignalOptions, skip bool) (map[api.TaskID]signalLocked, bool, error) {
	ids, topics, payloads, keys := make(textArray, len(sigs)), make(textArray, len(sigs)), make(textArray, len(sigs)), make(nullTextArray, len(sigs))
	for i, sg := range sigs {
		ids[i], topics[i], payloads[i] = string(sg.ID), sg.Topic, string(sg.Payload)
		keys[i] = pgtype.Text{String: sg.Key, Valid: sg.Key != ""}
	}
	reopen := make(textArray, len(opts.Reopen))
	for i, behavior := range opts.Reopen {
		reopen[i] = string(behavior)
	}
	locks := make(map[api.TaskID]signalLocked, len(sigs))
	var stored, woke int
	lock := signalLockSQL
	if skip {
		lock = signalTryLockSQL
	}
	b := &pgx.Batch{}
	if tx != nil {
		b.Queue(seqscanSaveOffSQL)
	} else {
		// Planned anew at each execution otherwise: the planning took
		// 1.4 ms of a batch's 2.3 (see genericSettingsSQL).
		b.Queue(genericSettingsSQL)
	}
	b.Queue(lock, ids, reopen).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var id string
			var l signalLocked
			if err := rows.Scan(&id, &l.locked, &l.finished, &l.workflow); err != nil {
				return err
			}
			locks[api.TaskID(id)] = l
		}
		return rows.Err()
	})
	b.Queue(signalSQL, ids, topics, payloads, keys, opts.Lock == store.SignalAll, reopen).QueryRow(func(r pgx.Row) error {
		return r.Scan(&stored, &woke)
	})
	if tx != nil {
		b.Queue(seqscanRestoreSQL)
	}
	var q batcher = s.pool
	if tx != nil {
		q = tx
	}
	if err := q.SendBatch(ctx, b).Close(); err != nil {
		return nil, false, err
	}
	return locks, woke > 0, nil
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

// isDeadlock reports whether err is PostgreSQL's ending a transaction to
// break a deadlock (SQLSTATE 40P01).
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}
