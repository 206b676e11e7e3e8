-- Claims stop rewriting index entries of stint_task.
--
-- Before: a claim moved a task's schedule_not_before (its place in the claim
-- index) to its lease expiry, and a finish moved it out again, so each was
-- an update that wrote a new entry into every index of the wide task row.
-- Now no index of stint_task covers a column that a claim or a finish
-- changes, and the page keeps room for both new row versions (fillfactor),
-- so both are HOT updates: no index writes at all.
--
-- stint_due holds claim hints: a row per time a task became due, in pickup
-- order. A claim deletes the hints it takes and claims a task only if the
-- hint still matches it (status, due time and priority), so a hint that a
-- later change made stale is dropped where it is found and needs no index
-- by task id. stint_lease holds one lease per claim statement and behavior
-- (the lease token of all its tasks), renewed as one row, and found by
-- expiry when its node dies; its tasks still running then are due again.
CREATE TABLE stint_due (
    id        text COLLATE "C" NOT NULL,
    behavior  text        NOT NULL,
    priority  smallint    NOT NULL,
    due       timestamptz NOT NULL,
    group_key text
);
CREATE INDEX stint_due_order ON stint_due (priority, due);
ALTER TABLE stint_due SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);

CREATE TABLE stint_lease (
    lease      uuid        PRIMARY KEY,
    node       text        NOT NULL,
    expires_at timestamptz NOT NULL,
    task_ids   text[]      NOT NULL
);
CREATE INDEX stint_lease_expiry ON stint_lease (expires_at);

INSERT INTO stint_due (id, behavior, priority, due, group_key)
SELECT id, behavior, priority, schedule_not_before, group_key FROM stint_task
WHERE status IN ('scheduled', 'success', 'failure') AND schedule_not_before IS NOT NULL;

INSERT INTO stint_lease (lease, node, expires_at, task_ids)
SELECT lease, coalesce(min(node), ''), max(lost_not_before), array_agg(id) FROM stint_task
WHERE status = 'running' GROUP BY lease;

DROP INDEX stint_task_claim;
-- The group index must not cover status, which every claim changes.
DROP INDEX stint_task_group;
CREATE INDEX stint_task_group ON stint_task (group_key) WHERE group_key IS NOT NULL;
-- A running task keeps the due time it was claimed at (a takeover puts it
-- back in its place); its lease expiry lives in its lease row.
ALTER TABLE stint_task DROP CONSTRAINT stint_task_running;
ALTER TABLE stint_task ADD CONSTRAINT stint_task_running CHECK (status <> 'running' OR (
    executed_at IS NOT NULL AND lease IS NOT NULL AND lost_not_before > executed_at AND schedule_not_before IS NOT NULL));
-- A task's row is written three times (submit, claim, finish): at 30% a
-- page has room for the two later versions of the rows inserted into it.
ALTER TABLE stint_task SET (fillfactor = 30);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node') AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_due, stint_lease TO stint_node;
        -- A submit adds hints; only a claim (a node) takes them.
        GRANT SELECT, INSERT ON stint_due TO stint_client;
        GRANT SELECT ON stint_lease TO stint_client;
    END IF;
END
$$;
