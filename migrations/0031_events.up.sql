-- Events: values a running task publishes under keys of its own
-- (spi.RunContext.SetEvent), for any process to read or await before the
-- task ends ("preview ready", "50% done"). A row is written by the run's
-- fenced statement, over the key's earlier value; it outlives the task's
-- retries and goes with the task. created is the task's created_at when
-- the value was set: a row of an earlier task of the same id (left by a
-- node of a release that deleted the task without its events) is none of
-- the task's, and the task's own value of the key overwrites it.
CREATE TABLE stint_event (
    task_id text COLLATE "C" NOT NULL,
    key     text        NOT NULL,
    value   jsonb       NOT NULL,
    at      timestamptz NOT NULL,
    created timestamptz NOT NULL,
    PRIMARY KEY (task_id, key)
);

-- Nodes set events and delete them with their tasks; clients read them
-- and delete them when they remove a task.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_event TO stint_node;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        GRANT SELECT, DELETE ON stint_event TO stint_client;
    END IF;
END
$$;
