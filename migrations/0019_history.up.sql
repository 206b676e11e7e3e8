-- The dashboard's history: per minute and behavior, the runs that ended
-- (succeeded, failed, and of the failed those that will run again), and
-- the due backlog and queue lag sampled once in that minute for the whole
-- cluster. Every node adds its own finish counts to the minute's row;
-- the node that first records a sample of a minute (its row in
-- stint_history_sample) samples the backlog and trims rows past the
-- retention. The primary key leads with the minute, so that reading the
-- last hour and trimming the oldest walk it in order.
CREATE TABLE stint_history (
    bucket    timestamptz NOT NULL,
    behavior  text        NOT NULL,
    succeeded bigint      NOT NULL DEFAULT 0,
    failed    bigint      NOT NULL DEFAULT 0,
    retried   bigint      NOT NULL DEFAULT 0,
    -- due and lag_us are NULL until the minute's sample is taken.
    due       bigint,
    lag_us    bigint,
    PRIMARY KEY (bucket, behavior)
);

CREATE TABLE stint_history_sample (
    bucket   timestamptz PRIMARY KEY,
    taken_at timestamptz NOT NULL DEFAULT now()
);

-- Nodes write the history; clients (the dashboard of a client-only
-- process) read it.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node') AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_history, stint_history_sample TO stint_node;
        GRANT SELECT ON stint_history TO stint_client;
    END IF;
END
$$;
