-- Periodic schedules: each fires a task of its behavior at the times its
-- spec gives. last_tick is the tick that last fired; a node fires the next
-- one by moving last_tick forward with a compare-and-set in the
-- transaction that submits the tick's task, so each tick fires once
-- across all nodes.
CREATE TABLE stint_schedule (
    name       text COLLATE "C" PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    behavior   text NOT NULL,
    spec       text NOT NULL,
    time_zone  text NOT NULL DEFAULT 'UTC',
    params     jsonb NOT NULL DEFAULT '{}',
    -- registered: declared by a behavior and written by every node that
    -- runs it at its start; added: added at runtime through the API.
    origin     text NOT NULL CHECK (origin IN ('registered', 'added')),
    last_tick  timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_schedule TO stint_node;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        -- Clients add, list and remove schedules; only nodes fire them.
        GRANT SELECT, INSERT, DELETE ON stint_schedule TO stint_client;
        GRANT UPDATE (behavior, spec, time_zone, params, origin, updated_at) ON stint_schedule TO stint_client;
    END IF;
END
$$;
