-- The persistent replications of behaviors/replication: one row per
-- definition (CouchDB's _replicator documents). replication.Define validates
-- a definition (statically and against the source and target catalogs),
-- writes its row and submits its task; replication.Undefine deletes the row
-- and removes the task. A task of a persistent replication reads its
-- definition from here when it starts and at each checkpoint, so an update
-- reaches a running replication, and records the terminal state here
-- (completed or failed), which outlives the task once the cleanup behavior
-- deletes it.
CREATE TABLE stint_replication (
    name           text        PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 200),
    owner          text        NOT NULL DEFAULT '',
    continuous     boolean     NOT NULL,
    -- The replication's params (replication.Params), definition name included.
    params         jsonb       NOT NULL,
    -- The task that runs the definition: deterministic from the source, the
    -- target, the filter and the owner, so two definitions of one
    -- replication are refused.
    task_id        text        NOT NULL UNIQUE,
    -- The hash of everything that could change the result (FACTS §3).
    replication_id text        NOT NULL,
    -- Incremented by every update; a running task restarts when it changes.
    version        bigint      NOT NULL DEFAULT 1,
    -- The terminal state of the last run: NULL while the replication is
    -- active (pending, running, crashing).
    state          text        CHECK (state IN ('completed', 'failed')),
    -- The result (completed) or the error (failed) of that run.
    state_detail   jsonb,
    state_at       timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Server nodes run the replication behaviors (when the roles exist; see
-- the core migration roles).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_replication TO stint_node;
    END IF;
END
$$;
