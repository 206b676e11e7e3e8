-- Workflows: a graph of tasks stored at once. The workflow is a task of the
-- built-in behavior stint.workflow, the parent of its nodes: its children
-- count says how many nodes have not ended, and the end of the last one
-- makes it due, to record the workflow's outcome. A node is a task with a
-- name in its workflow (workflow_node), a rule (dep_rule; 'finally' is
-- all_ended on every other node, the nodes added later included) and the counts of
-- its dependencies by outcome: pending (not ended), succeeded, failed
-- (failed for good or cancelled) and skipped (ended by a rule of theirs).
-- A node whose rule does not yet allow it to run waits in the status
-- 'waiting', with no due time and no claim hint: the finish of its last
-- dependency decides, in the finishing transaction, whether it becomes due
-- or ends skipped.
ALTER TABLE stint_task
    ADD COLUMN workflow_node text,
    ADD COLUMN dep_rule text,
    ADD COLUMN deps_pending integer,
    ADD COLUMN deps_succeeded integer,
    ADD COLUMN deps_failed integer,
    ADD COLUMN deps_skipped integer;
ALTER TABLE stint_task DROP CONSTRAINT stint_task_status_known;
ALTER TABLE stint_task ADD CONSTRAINT stint_task_status_known
    CHECK (status IN ('scheduled', 'running', 'success', 'failure', 'held', 'waiting'));
ALTER TABLE stint_task ADD CONSTRAINT stint_task_waiting
    CHECK (status <> 'waiting' OR (schedule_not_before IS NULL AND deps_pending IS NOT NULL));
ALTER TABLE stint_task ADD CONSTRAINT stint_task_dep_rule
    CHECK (dep_rule IS NULL OR dep_rule IN ('all_succeeded', 'all_ended', 'any_succeeded', 'none_failed', 'finally'));

-- stint_dependency holds a workflow's edges: task_id runs after depends_on
-- by task_id's rule. Its ids collate as the tasks' do, so that a join on
-- them can use either table's index. The primary key serves the finish (the dependents of
-- the tasks that ended); the second index, the reads of what a node waits
-- on and of its dependencies' results.
CREATE TABLE stint_dependency (
    depends_on text COLLATE "C" NOT NULL,
    task_id    text COLLATE "C" NOT NULL,
    PRIMARY KEY (depends_on, task_id)
);
CREATE INDEX stint_dependency_task ON stint_dependency (task_id, depends_on);

-- The node role reads and writes the edges as every table of stint's; the
-- client role submits workflows (nodes inserted waiting, edges) and
-- retries them (nodes waiting again).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_dependency TO stint_node;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        GRANT SELECT, INSERT ON stint_dependency TO stint_client;
        GRANT UPDATE (deps_pending, deps_succeeded, deps_failed, deps_skipped, waiting_children, lost_not_before)
            ON stint_task TO stint_client;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_policies WHERE tablename = 'stint_task' AND policyname = 'stint_client_insert') THEN
        ALTER POLICY stint_client_insert ON stint_task
            WITH CHECK (status IN ('scheduled', 'waiting') AND lease IS NULL AND node IS NULL AND result IS NULL AND error IS NULL);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_policies WHERE tablename = 'stint_task' AND policyname = 'stint_client_update') THEN
        ALTER POLICY stint_client_update ON stint_task
            WITH CHECK (status IN ('scheduled', 'held', 'running', 'waiting') OR schedule_not_before IS NOT NULL);
    END IF;
END
$$;
