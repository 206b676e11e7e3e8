-- stint_attempt keeps the runs of a task that failed, one row per attempt,
-- so that a task's page shows every attempt with its error and not only the
-- last: the node that ran it, when it began (unknown for a run whose task
-- was resubmitted while it ran) and ended, and its error. The finish of a
-- failed run writes it in the finish's statement; a task whose attempts
-- start over (a retry by hand, a submit after it finished) overwrites its
-- rows as its runs fail again, and readers drop the rows left from before
-- (they ended out of order); deleting a task (remove, cleanup) deletes its
-- rows. A run lost with its node has no row.
CREATE TABLE stint_attempt (
    task_id    text COLLATE "C" NOT NULL,
    attempt    integer     NOT NULL,
    node       text,
    started_at timestamptz,
    ended_at   timestamptz NOT NULL,
    error      jsonb,
    PRIMARY KEY (task_id, attempt)
);

-- Nodes record failed runs and delete them with their tasks; clients read
-- them and delete them when they remove a task.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node') AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_attempt TO stint_node;
        GRANT SELECT, DELETE ON stint_attempt TO stint_client;
    END IF;
END
$$;
