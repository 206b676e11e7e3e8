-- Signals: messages sent to a task by topic (api.Signals), which its runs
-- receive in the order they were stored (spi.RunContext.Receive). A
-- message is consumed by the fenced checkpoint or finish of the run that
-- received it (consumed_at), so a run that lost its lease consumed
-- nothing; consumed rows stay, so that a later signal with the same
-- idempotency key stores nothing, until the task goes. created is the
-- task's created_at when the message was stored: a row of an earlier task
-- of the same id is none of the task's. seq orders a task's messages: a
-- signal locks its task's row before it takes one, so a task's messages
-- commit in seq order.
CREATE TABLE stint_signal (
    task_id     text COLLATE "C" NOT NULL,
    seq         bigint GENERATED ALWAYS AS IDENTITY,
    topic       text        NOT NULL,
    payload     jsonb       NOT NULL,
    key         text,
    at          timestamptz NOT NULL,
    created     timestamptz NOT NULL,
    consumed_at timestamptz,
    PRIMARY KEY (task_id, seq)
);

-- A run receives a topic's oldest unconsumed message.
CREATE INDEX stint_signal_pending ON stint_signal (task_id, topic, seq) WHERE consumed_at IS NULL;

-- A signal's idempotency key stores at most one message per task.
CREATE UNIQUE INDEX stint_signal_key ON stint_signal (task_id, key) WHERE key IS NOT NULL;

-- The topic a task sleeps on (spi.WaitForSignal): the signal that stores
-- a message of it makes the task due.
ALTER TABLE stint_task ADD COLUMN signal_wait text;

-- Clients send signals (waking the task that sleeps on the topic), read
-- them and delete them when they remove a task; nodes consume them and
-- delete them with their tasks.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_signal TO stint_node;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        GRANT SELECT, INSERT, DELETE ON stint_signal TO stint_client;
        GRANT UPDATE (signal_wait) ON stint_task TO stint_client;
    END IF;
END
$$;
