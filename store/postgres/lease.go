package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// Renew extends leases; see store.Store. Runs share the lease row of
// their claim: the statement renews each lease row once, and reports a run
// as held only if its task still runs under that lease.
func (s *Store) Renew(ctx context.Context, rs []store.Renewal) (map[api.TaskID]bool, error) {
	ids := make(textArray, len(rs))
	leases := make(uuidArray, len(rs))
	durs := make(intArray, len(rs))
	for i, r := range rs {
		ids[i], leases[i], durs[i] = string(r.ID), uuid(r.Lease), r.Duration.Microseconds()
	}
	held := make(map[api.TaskID]bool, len(rs))
	var id string
	if _, err := indexed(ctx, s.lease, func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&id}, func() error { held[api.TaskID(id)] = true; return nil })
		return err
	}, renewSQL, ids, leases, durs); err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	return held, nil
}

// renewSQL renews the lease rows $2 by the durations $3 (in microseconds;
// the longest of a lease's runs) and returns those of the tasks $1 that
// still run under their lease $2, renewed. The runs are grouped by lease
// first, so that each lease row renewed brings its runs' ids along and no
// join of the runs with the renewed leases is needed; each lease row and
// task is found by a probe of its primary key (see seqscanOffSQL). The
// lease rows are locked in lease order first, as a finish locks them (see
// leasesEnded), so that the two never deadlock.
var renewSQL = `
WITH r AS (
    SELECT lease, max(us) AS us, array_agg(id) AS ids
    FROM ` + unnestRows("r", "id $1::text[]", "lease $2::uuid[]", "us $3::bigint[]") + ` GROUP BY lease
), locked AS MATERIALIZED (
    SELECT l.lease, r.us, r.ids FROM r, stint_lease l WHERE l.lease = ANY(ARRAY[r.lease])
    ORDER BY r.lease FOR NO KEY UPDATE OF l
), renewed AS (
    UPDATE stint_lease l SET expires_at = now() + k.us * interval '1 microsecond'
    FROM locked k WHERE l.lease = ANY(ARRAY[k.lease])
    RETURNING l.lease, k.ids
)
SELECT t.id FROM renewed l, unnest(l.ids) AS x(id), stint_task t
WHERE t.id = ANY(ARRAY[x.id]) AND t.lease = l.lease AND t.status = 'running'`

// ReleaseLeases deletes lease rows none of whose tasks still runs under
// them; see store.Store.
func (s *Store) ReleaseLeases(ctx context.Context, leases [][16]byte) error {
	ls := make(uuidArray, len(leases))
	for i, l := range leases {
		ls[i] = uuid(l)
	}
	if _, err := indexed(ctx, s.pool, nil, releaseLeasesSQL, ls); err != nil {
		return fmt.Errorf("release leases: %w", err)
	}
	return nil
}

// releaseLeasesSQL deletes the lease rows $1 that no task still runs
// under. The node releases a lease once every run of it ended and its end
// was recorded or found fenced out, but after a failover the database may
// not be the one that recorded it: a promoted standby that had not
// received a finish shows its task running under the lease still, and
// deleting the row would leave that task running with no lease to expire
// and be taken over. Such a row is kept: it expires, and a takeover makes
// its task due again. Each task is found by a probe of its primary key.
const releaseLeasesSQL = `
DELETE FROM stint_lease l WHERE l.lease = ANY($1) AND NOT EXISTS (
    SELECT 1 FROM unnest(l.task_ids) AS x(id), stint_task t
    WHERE t.id = ANY(ARRAY[x.id]) AND t.lease = l.lease AND t.status = 'running')`

// takeoverSQL takes over up to $1 expired leases: it makes their tasks that
// still run under them due again (their node died, stalled or was cut off
// for longer than the lease) and deletes the leases. It never waits for a
// lock: it skips leases another takeover holds, and tasks whose row another
// transaction locked (a stalled node inside its own transaction after
// CheckpointTx); a lease with such a task is kept, so that a later takeover
// finds that task once the lock is gone (kept: the leases with a task it
// could not lock, counted per lease rather than matched task by task). A
// lost task is due at the time it
// was due when claimed, so that it goes back to its place in the queue
// rather than behind every task that became due while it ran. The lost run
// counts as an attempt (the next claim increments it), as a lost Polaris
// task does. A submit that came during the lost run asks for no run of its
// own: the re-run covers it, and is reported as a resubmitted run. Tasks
// are found by their ids from the leases' arrays, each by a probe of the
// primary key (see seqscanOffSQL), so that the
// plan is a probe per task whatever the statistics say: a join let the
// planner read every task to find, most often, none.
var takeoverSQL = `
WITH expired AS MATERIALIZED (
    SELECT lease, task_ids FROM stint_lease WHERE expires_at <= now()
    ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
), owned AS MATERIALIZED (
    SELECT t.id, t.lease FROM expired e, unnest(e.task_ids) AS x(id), stint_task t
    WHERE t.id = ANY(ARRAY[x.id]) AND t.lease = e.lease AND t.status = 'running'
), free AS MATERIALIZED (
    SELECT t.id, t.lease FROM owned o, stint_task t
    WHERE t.id = ANY(ARRAY[o.id]) AND t.lease = o.lease AND t.status = 'running'
    FOR UPDATE OF t SKIP LOCKED
), kept AS MATERIALIZED (
    SELECT o.lease FROM (SELECT lease, count(*) AS n FROM owned GROUP BY lease) o
    LEFT JOIN (SELECT lease, count(*) AS n FROM free GROUP BY lease) f ON f.lease = o.lease
    WHERE f.n IS DISTINCT FROM o.n
), dropped AS (
    DELETE FROM stint_lease l USING expired e
    WHERE l.lease = ANY(ARRAY[e.lease]) AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.lease = e.lease)
    RETURNING l.lease
), lost AS (
    UPDATE stint_task t SET status = 'scheduled', schedule_not_before = least(t.schedule_not_before, now()), lost_not_before = NULL,
        executed_at = NULL, resubmit = t.resubmit OR t.resubmitted, resubmit_due = NULL, updated_at = now()
    FROM free f
    WHERE t.id = ANY(ARRAY[f.id]) AND t.lease = f.lease AND t.status = 'running'
    RETURNING t.id, t.behavior, t.priority, t.schedule_not_before, t.group_key, t.status, t.parent_id
), due AS (` + dueInsert("lost") + `
), feed AS (` + feedInsert("lost", "'scheduled'::text", "false") + `
), wake AS MATERIALIZED (
    SELECT pg_notify('` + store.ChannelDue + `', '') FROM (SELECT 1 FROM lost LIMIT 1) l
)
SELECT (SELECT count(*) FROM dropped), (SELECT count(*) FROM lost) FROM (SELECT count(*) FROM wake) w`

// Takeover makes the tasks of expired leases due again; see store.Store.
func (s *Store) Takeover(ctx context.Context, limit int) (leases, tasks int, err error) {
	if err := indexedRow(ctx, s.lease, takeoverSQL, limit).Scan(&leases, &tasks); err != nil {
		return 0, 0, fmt.Errorf("take over expired leases: %w", err)
	}
	return leases, tasks, nil
}

// ReleaseClaim gives back what a claim took under the leases its node
// drew, and spends them; see store.Store. One transaction: the leases are
// spent first (releaseSpendSQL), which waits for a claim with them still
// in flight to end, so that the statements after it see what that claim
// committed; a claim that has not written its lease rows yet finds them
// spent and fails. Then the tasks still running under them are given
// back as Unclaim gives back a run (unclaimSQL), keeping their place in
// the queue, and the leases' rows keep no task.
func (s *Store) ReleaseClaim(ctx context.Context, req store.ClaimRequest) error {
	if len(req.Leases) == 0 {
		return nil
	}
	if err := checkLeases(req); err != nil {
		return err
	}
	behaviors, _ := behaviorLeases(req.Behaviors)
	leases := claimLeases(req)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, releaseSpendSQL, leases, req.Node, behaviors, releasedLeaseKeep.Microseconds()); err != nil {
			return err
		}
		var ids []string
		var owners []pgtype.UUID
		if err := tx.QueryRow(ctx, releaseRunsSQL, leases).Scan(&ids, &owners); err != nil {
			return err
		}
		if len(ids) > 0 {
			if _, err := indexed(ctx, tx, nil, unclaimSQL, textArray(ids), uuidArray(owners), false, int64(0)); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, releaseEmptySQL, leases, releasedLeaseKeep.Microseconds())
		return err
	})
	if err != nil {
		return fmt.Errorf("release a claim: %w", err)
	}
	return nil
}

// releasedLeaseKeep is how long a lease ReleaseClaim spent keeps its row,
// with no task, before a takeover drops it: longer than a claim that
// carries it could still wait in the database to run.
const releasedLeaseKeep = 10 * time.Minute

// releaseSpendSQL writes a row with no task for each lease $1 (of node $2,
// for the behaviors $3, kept $4 microseconds) that has none: it waits for
// a claim in flight that wrote one, and a claim that writes one after it
// fails. The rows go in in lease order, as a claim's do.
const releaseSpendSQL = `
INSERT INTO stint_lease (lease, node, expires_at, task_ids, task_count, behavior)
SELECT u.lease, $2, now() + $4 * interval '1 microsecond', '{}', 0, u.behavior
FROM unnest($1::uuid[], $3::text[]) AS u(lease, behavior)
ORDER BY u.lease
ON CONFLICT (lease) DO NOTHING`

// releaseRunsSQL returns the tasks the lease rows $1 name, with their
// leases, as arrays.
const releaseRunsSQL = `
SELECT coalesce(array_agg(x.id), '{}'), coalesce(array_agg(l.lease), '{}')
FROM stint_lease l, unnest(l.task_ids) AS x(id) WHERE l.lease = ANY($1)`

// releaseEmptySQL leaves the lease rows $1 with no task, kept $2
// microseconds from now.
const releaseEmptySQL = `
UPDATE stint_lease SET task_ids = '{}', task_count = 0, expires_at = now() + $2 * interval '1 microsecond'
WHERE lease = ANY($1)`

// Probe asks the database a statement whose work depends on no payload's
// size, on the pool of the statements that keep leases, which carry no
// payload either: it answers whether the database answers, when a
// statement on big rows outran its deadline.
func (s *Store) Probe(ctx context.Context) error {
	if err := s.lease.Ping(ctx); err != nil {
		return fmt.Errorf("probe the database: %w", err)
	}
	return nil
}
