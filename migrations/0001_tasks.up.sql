-- stint_task holds one row per task. A task is claimable when
-- schedule_not_before <= now(): for scheduled, success and failure rows that is
-- the next due time; for running rows it equals lost_not_before (the lease
-- expiry), so one partial index serves both claims and lost-task takeover.
CREATE TABLE stint_task (
    id                  text        PRIMARY KEY,
    behavior            text        NOT NULL,
    status              text        NOT NULL DEFAULT 'scheduled',
    priority            smallint    NOT NULL DEFAULT 5,
    params              jsonb       NOT NULL DEFAULT '{}',
    result              jsonb,
    error               jsonb,
    progress            jsonb,
    schedule_not_before timestamptz,
    lost_not_before     timestamptz,
    lease               uuid,
    node                text,
    attempt             integer     NOT NULL DEFAULT 0,
    errors              integer     NOT NULL DEFAULT 0,
    resubmit            boolean     NOT NULL DEFAULT false,
    awaited             boolean     NOT NULL DEFAULT false,
    parent_id           text,
    group_key           text,
    trace               text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    executed_at         timestamptz,
    finished_at         timestamptz,

    CONSTRAINT stint_task_id_length CHECK (char_length(id) BETWEEN 3 AND 128),
    CONSTRAINT stint_task_behavior_length CHECK (char_length(behavior) BETWEEN 3 AND 64),
    CONSTRAINT stint_task_status_known CHECK (status IN ('scheduled', 'running', 'success', 'failure', 'held')),
    -- The per-status invariants of Polaris tasks.
    CONSTRAINT stint_task_scheduled CHECK (status <> 'scheduled' OR (schedule_not_before IS NOT NULL AND executed_at IS NULL)),
    CONSTRAINT stint_task_running CHECK (status <> 'running' OR (
        executed_at IS NOT NULL AND lease IS NOT NULL AND lost_not_before > executed_at
        AND schedule_not_before = lost_not_before)),
    CONSTRAINT stint_task_success CHECK (status <> 'success' OR result IS NOT NULL),
    CONSTRAINT stint_task_failure CHECK (status <> 'failure' OR error IS NOT NULL),
    CONSTRAINT stint_task_held CHECK (status <> 'held' OR schedule_not_before IS NULL)
);

-- The claim index: due rows in pickup order. Finished and held rows have no
-- schedule_not_before and stay out of it, so it stays small as history grows.
CREATE INDEX stint_task_claim ON stint_task (priority, schedule_not_before)
    WHERE schedule_not_before IS NOT NULL;

CREATE INDEX stint_task_parent ON stint_task (parent_id) WHERE parent_id IS NOT NULL;

-- stint_node lists the server nodes; each renews heartbeat_at while it runs.
CREATE TABLE stint_node (
    id           text        PRIMARY KEY,
    host         text        NOT NULL DEFAULT '',
    pid          integer     NOT NULL DEFAULT 0,
    behaviors    text[]      NOT NULL DEFAULT '{}',
    max_workers  integer     NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);
