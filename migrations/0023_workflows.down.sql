DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_policies WHERE tablename = 'stint_task' AND policyname = 'stint_client_insert') THEN
        ALTER POLICY stint_client_insert ON stint_task
            WITH CHECK (status = 'scheduled' AND lease IS NULL AND node IS NULL AND result IS NULL AND error IS NULL);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_policies WHERE tablename = 'stint_task' AND policyname = 'stint_client_update') THEN
        ALTER POLICY stint_client_update ON stint_task
            WITH CHECK (status IN ('scheduled', 'held', 'running') OR schedule_not_before IS NOT NULL);
    END IF;
END
$$;
DROP TABLE IF EXISTS stint_dependency;
DELETE FROM stint_task WHERE status = 'waiting';
ALTER TABLE stint_task DROP CONSTRAINT IF EXISTS stint_task_dep_rule;
ALTER TABLE stint_task DROP CONSTRAINT IF EXISTS stint_task_waiting;
ALTER TABLE stint_task DROP CONSTRAINT stint_task_status_known;
ALTER TABLE stint_task ADD CONSTRAINT stint_task_status_known
    CHECK (status IN ('scheduled', 'running', 'success', 'failure', 'held'));
ALTER TABLE stint_task
    DROP COLUMN IF EXISTS workflow_node,
    DROP COLUMN IF EXISTS dep_rule,
    DROP COLUMN IF EXISTS deps_pending,
    DROP COLUMN IF EXISTS deps_succeeded,
    DROP COLUMN IF EXISTS deps_failed,
    DROP COLUMN IF EXISTS deps_skipped;
