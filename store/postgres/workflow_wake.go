package postgres

// The wake of workflow nodes: when tasks end for good, their parents'
// counts and their dependents' verdicts change in the ending transaction.

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// depsEndedSQL counts the tasks $1, which ended for good, and those of $6
// whose workflow grew at run time (see nodesEnded), off the dependents
// that wait for them, and decides each dependent its count
// changed by its rule: it runs (scheduled, due now, with its claim hint),
// it is skipped (a failure with code skipped whose message names the
// dependency that decided it), or it waits on. It returns the skipped
// dependents and their parents (the workflows), whose ends the caller
// counts in turn, as finishes count their tasks', in the same transaction.
//
// Each dependent is found, counted and decided by one UPDATE: its new
// counts and its verdict are computed in the SET from the row as the
// update finds it, so that two finishes of its dependencies at once are
// ordered by its row lock and the second, re-reading the row the first
// committed, sees every other's count. A fan-out's root thus reads and
// writes each dependent once. Each ended task is read once, each of their
// workflows once (a dependent is of its dependency's workflow: a node of a
// held workflow that may run is stored held, due once released), and an
// ended task's dependents are found by a probe of each index that holds
// them (see edgesByDependency; an index scan: see probesSaveOffSQL):
// OFFSET 0 keeps the lateral subqueries from being flattened into joins,
// which the planner made a merge join over the whole index.
//
// A dependent that runs may start at once on the node $2 (a local start,
// see store.Store.FinishStart) when the finish touched no more dependents
// than the $5 runs the node has room for: then every one of them that
// runs and is of the behaviors $3 (with their leases $4, unless an
// operator set one) starts running under a fresh lease per behavior, as a
// claim starts it, with no claim hint, when a claim could take it now:
// its behavior neither paused nor capped at runtime, its group key not
// held, no rate uses, and no due hint of its behavior with the same or a
// lower priority number in the claim index (a local start never jumps a
// task the claimers would take before it). A finish that touches more
// (a wide fan-out) leaves them all to the claimers, which take them in
// priority order at once, rather than choosing among them here: the
// local start saves a round trip, which counts for a chain's hop and not
// for ten thousand nodes. The pause and hold rows are read as the starting
// submit reads them (see submitStatement). A started node's run and lease
// count from the statement's time, not the transaction's, which may have
// waited for its workflow's row. A node started so has two events in the
// change feed, scheduled (ready) and running, as one a claim starts has.
// The statement also returns the started tasks (with their params and
// progress, which the others leave out), as JSON.
var depsEndedSQL = `
WITH d AS MATERIALIZED (
    SELECT x.id, d.status, d.error->>'code' AS code, d.workflow_node, d.parent_id
    FROM (SELECT unnest($1::text[]) AS id
        UNION ALL
        SELECT o.id FROM unnest($6::text[]) AS o(id)
        WHERE split_part(o.id, '/', 1) = ANY(ARRAY(SELECT w.id FROM stint_task w
            WHERE w.id = ANY(ARRAY(SELECT DISTINCT split_part(o.id, '/', 1) FROM unnest($6::text[]) AS o(id)))
              AND w.params ? 'grown'))) x,
        LATERAL (SELECT d.status, d.error, d.workflow_node, d.parent_id FROM stint_task d WHERE d.id = x.id OFFSET 0) d
), ended AS MATERIALIZED (
    SELECT e.task_id,
        count(*) AS n,
        count(*) FILTER (WHERE d.status = 'success') AS ok,
        count(*) FILTER (WHERE d.status <> 'success' AND coalesce(d.code, '') <> '` + api.CodeSkipped + `') AS failed,
        count(*) FILTER (WHERE d.code = '` + api.CodeSkipped + `') AS skipped,
        min(d.workflow_node) FILTER (WHERE d.status <> 'success') AS bad,
        bool_or(d.parent_id = ANY(ARRAY(SELECT w.id FROM stint_task w
            WHERE w.id = ANY(ARRAY(SELECT DISTINCT parent_id FROM d)) AND w.status = 'held'))) AS held
    FROM d, LATERAL (` + edgesByDependency(`d.id COLLATE "C"`) + `) e
    GROUP BY e.task_id
), local AS MATERIALIZED (
    SELECT t.behavior, t.priority, t.group_key
    FROM ended e JOIN stint_task t ON t.id = ANY(ARRAY[e.task_id])
    WHERE (SELECT count(*) FROM ended) <= $5::int
      AND t.status = 'waiting' AND t.rate_uses IS NULL AND e.held IS NOT TRUE
), cfg AS MATERIALIZED (
    SELECT w.behavior, coalesce(b.lease_ms * 1000, w.lease_us) AS lease_us, gen_random_uuid() AS lease,
        (SELECT d.priority FROM stint_due d WHERE NOT d.parked AND d.behavior = w.behavior
             AND d.priority <= (SELECT max(priority) FROM local) AND d.due <= now()
         ORDER BY d.priority, d.due LIMIT 1) AS first
    FROM unnest($3::text[], $4::bigint[]) AS w(behavior, lease_us)
    LEFT JOIN stint_behavior b ON b.behavior = w.behavior
    WHERE w.behavior = ANY(ARRAY(SELECT behavior FROM local)) AND b.paused IS NOT TRUE AND ` + uncapped("w.behavior") + `
), paused AS MATERIALIZED (
    SELECT pb.behavior FROM stint_behavior pb
    WHERE pb.paused AND pb.behavior IN (SELECT behavior FROM cfg) FOR SHARE SKIP LOCKED
), held AS MATERIALIZED (
    SELECT ph.group_key FROM stint_hold ph
    WHERE ph.group_key = ANY(ARRAY(SELECT group_key FROM local WHERE behavior IN (SELECT behavior FROM cfg)))
    FOR SHARE SKIP LOCKED
), u AS (
    UPDATE stint_task t SET (deps_pending, deps_succeeded, deps_failed, deps_skipped, status, schedule_not_before, held_due,
            error, finished_at, lease, node, attempt, executed_at, lost_not_before, waiting_children, resubmitted, resubmit,
            updated_at) = (
        SELECT v.pending, v.ok, v.failed, v.skipped,
            CASE WHEN g.lease IS NOT NULL THEN 'running' ELSE CASE v.verdict
                WHEN 'run' THEN CASE WHEN e.held THEN 'held' ELSE 'scheduled' END
                WHEN 'skip' THEN 'failure' ELSE 'waiting' END END,
            CASE WHEN v.verdict = 'run' AND e.held IS NOT TRUE THEN now() END,
            CASE WHEN v.verdict = 'run' AND e.held THEN now() ELSE t.held_due END,
            CASE WHEN v.verdict = 'skip' THEN jsonb_build_object('retryable', false, 'code', '` + api.CodeSkipped + `',
                'message', CASE WHEN t.dep_rule = 'any_succeeded' THEN 'no dependency succeeded'
                    ELSE format('dependency %s did not succeed', e.bad) END) ELSE t.error END,
            CASE WHEN v.verdict = 'skip' THEN now() END,
            coalesce(g.lease, t.lease),
            CASE WHEN g.lease IS NULL THEN t.node ELSE $2 END,
            t.attempt + CASE WHEN g.lease IS NULL THEN 0 ELSE 1 END,
            CASE WHEN g.lease IS NULL THEN t.executed_at ELSE statement_timestamp() END,
            CASE WHEN g.lease IS NULL THEN t.lost_not_before
                ELSE statement_timestamp() + g.lease_us * interval '1 microsecond' END,
            t.waiting_children AND g.lease IS NULL,
            CASE WHEN g.lease IS NULL THEN t.resubmitted ELSE t.resubmit END,
            t.resubmit AND g.lease IS NULL,
            now()
        FROM (SELECT c.*, CASE
                WHEN t.dep_rule IN ('all_ended', 'finally') THEN CASE WHEN pending <= 0 THEN 'run' END
                WHEN t.dep_rule = 'any_succeeded' THEN CASE WHEN ok > 0 THEN 'run' WHEN pending <= 0 THEN 'skip' END
                WHEN t.dep_rule = 'none_failed' THEN CASE WHEN failed > 0 THEN 'skip' WHEN pending <= 0 THEN 'run' END
                ELSE CASE WHEN failed + skipped > 0 THEN 'skip' WHEN pending <= 0 THEN 'run' END
            END AS verdict
            FROM (SELECT t.deps_pending - e.n AS pending, t.deps_succeeded + e.ok AS ok, t.deps_failed + e.failed AS failed,
                t.deps_skipped + e.skipped AS skipped) c) v
        LEFT JOIN LATERAL (
            SELECT g.lease, g.lease_us FROM cfg g
            WHERE g.behavior = t.behavior AND v.verdict = 'run' AND e.held IS NOT TRUE AND t.rate_uses IS NULL
              AND (g.first IS NULL OR g.first > t.priority)
              AND t.behavior NOT IN (SELECT behavior FROM paused)
              AND (t.group_key IS NULL OR (t.group_key NOT IN (SELECT group_key FROM held)
                  AND NOT EXISTS (SELECT 1 FROM stint_hold h WHERE h.group_key = t.group_key)))) g ON true)
    FROM ended e
    WHERE t.id = ANY(ARRAY[e.task_id]) AND t.status = 'waiting'
    RETURNING t.id, t.behavior, t.priority, t.schedule_not_before, t.group_key, t.status, t.parent_id, t.awaited,
        CASE t.status WHEN 'waiting' THEN NULL WHEN 'failure' THEN 'skip' ELSE 'run' END AS verdict,
        CASE WHEN t.status = 'running' THEN t.lease END AS started,
        CASE WHEN t.status = 'running' THEN (SELECT g.lease_us FROM cfg g WHERE g.behavior = t.behavior) END AS lease_us,
        t.attempt, t.errors, t.resubmitted,
        CASE WHEN t.status = 'running' THEN t.params END AS params,
        CASE WHEN t.status = 'running' THEN t.progress END AS progress,
        CASE WHEN t.status = 'running' THEN t.trace END AS trace, t.version
), due AS (` + dueInsert("u") + `
), ` + waitsEnded("SELECT id FROM u WHERE verdict = 'skip'") + `, leases AS (
    INSERT INTO stint_lease (lease, node, expires_at, task_ids, task_count, behavior)
    SELECT started, $2, statement_timestamp() + max(lease_us) * interval '1 microsecond', array_agg(id), count(*), min(behavior)
    FROM u WHERE started IS NOT NULL GROUP BY started
), feed AS (` + feedInsert(`(SELECT u.id, u.behavior, u.parent_id, 'scheduled' AS status, u.verdict
        FROM u WHERE u.verdict IS NOT NULL AND u.started IS NOT NULL
    UNION ALL
    SELECT u.id, u.behavior, u.parent_id, u.status, u.verdict FROM u WHERE u.verdict IS NOT NULL) x`, "status", "verdict = 'skip'") + `
), notified AS (
    SELECT count(pg_notify('` + store.ChannelFinished + `', id)) AS n FROM u WHERE verdict = 'skip' AND awaited
), woke AS (
    SELECT count(pg_notify('` + store.ChannelDue + `', '')) AS n FROM (SELECT 1 FROM u WHERE status = 'scheduled' LIMIT 1) d
)
SELECT ARRAY(SELECT id FROM u WHERE verdict = 'skip'), ARRAY(SELECT parent_id FROM u WHERE verdict = 'skip' AND parent_id IS NOT NULL),
    (SELECT json_agg(json_build_object('id', id, 'lease', started, 'lease_us', lease_us, 'behavior', behavior,
        'params', params, 'progress', progress, 'attempt', attempt, 'errors', errors, 'priority', priority, 'parent', parent_id,
        'group_key', group_key, 'trace', trace, 'resubmitted', resubmitted, 'version', version)) FROM u WHERE started IS NOT NULL)
FROM notified, woke`

// nodesEnded records in the transaction q that tasks ended for good, in
// rounds of one round trip each. A round counts the tasks off their
// parents (childrenEndedSQL: parents holds each task's parent; none when
// empty), then wakes or skips the dependents of the workflow nodes ids,
// and of the nodes others whose workflow grew at run time (depsEndedSQL):
// that statement starts once the workflows' rows are locked, so it sees
// the edges a growth committed meanwhile, which a probe of the edges made
// before could not. The nodes it skips end in the next round, until none
// is. The dependents that run start on st's node, as many as st has room
// for (none when st is nil or ids is empty), as depsEndedSQL says; they
// are returned, and st learns of them from the caller once the
// transaction committed. With commit, the first round's round trip also
// commits the transaction: only when no task of ids failed, since a
// success skips no dependent and no round follows.
func nodesEnded(ctx context.Context, q batcher, parents, ids, others []string, st *starts, commit bool) ([]store.Claimed, error) {
	var started []store.Claimed
	for first := true; len(parents)+len(ids)+len(others) > 0 || first && commit; first = false {
		b := &pgx.Batch{}
		b.Queue(probesSaveOffSQL)
		if len(parents) > 0 {
			b.Queue(childrenEndedSQL, textArray(parents))
		}
		var raw []byte
		skipped, skippedParents := []string(nil), []string(nil)
		if len(ids)+len(others) > 0 {
			node, behaviors, leases, limit := "", []string{}, []int64{}, 0
			if st != nil && len(ids) > 0 {
				node, behaviors, leases, limit = st.Node, st.behaviors, st.leases, st.room()-len(started)
			}
			b.Queue(depsEndedSQL, textArray(ids), node, behaviors, leases, max(limit, 0), textArray(others)).QueryRow(func(r pgx.Row) error {
				return r.Scan(&skipped, &skippedParents, &raw)
			})
		}
		b.Queue(probesRestoreSQL)
		if first && commit {
			b.Queue("COMMIT")
		}
		if err := q.SendBatch(ctx, b).Close(); err != nil {
			return nil, fmt.Errorf("wake dependents: %w", err)
		}
		if raw != nil {
			var err error
			if started, err = appendStarted(started, raw); err != nil {
				return nil, fmt.Errorf("wake dependents: %w", err)
			}
		}
		if first && commit {
			if len(skipped) > 0 {
				return nil, fmt.Errorf("wake dependents: a success skipped %d of them", len(skipped))
			}
			return started, nil
		}
		parents, ids, others = skippedParents, skipped, nil
	}
	return started, nil
}
