-- Steps: the checkpoints a behavior keeps (spi.Policy.KeepSteps), one row
-- each, numbered from 1 per task. stint_task.step is the number of the
-- task's last step (NULL: none): a task's steps are its rows 1 to step. A
-- checkpoint of such a behavior raises it and writes the step in the
-- checkpoint's statement, fenced by the run's lease as the progress is; a
-- rewind to step k (api.Operator.Rewind) sets it to k and deletes the rows
-- after k, and a fork (api.Operator.Fork) copies the rows 1 to k to the new
-- task. Deleting a task (remove, cleanup) deletes its rows. A row above a
-- task's step (left by a node of an earlier release that deleted the task
-- without it) is no step of the task, and the task's next step overwrites
-- it.
ALTER TABLE stint_task ADD COLUMN step integer;

CREATE TABLE stint_step (
    task_id  text COLLATE "C" NOT NULL,
    step     integer     NOT NULL,
    progress jsonb       NOT NULL,
    at       timestamptz NOT NULL,
    PRIMARY KEY (task_id, step)
);

-- Nodes write steps and delete them with their tasks; clients read them,
-- rewind (the task's step, and the steps after it deleted), fork (steps
-- copied to a new task, over rows above a deleted task's steps) and delete
-- them when they remove a task.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_step TO stint_node;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_step TO stint_client;
        GRANT UPDATE (step) ON stint_task TO stint_client;
    END IF;
END
$$;
