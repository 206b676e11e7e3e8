-- The client role can do every verb of api.Tasks and api.Operator (submit,
-- await, remove, hold, release, retry, group holds, pause, progress of a
-- waiting task) and cannot forge an outcome: it cannot write a task's
-- result, error, lease or node, insert a task in any state but scheduled,
-- or leave one succeeded or failed for good. Column privileges keep it off
-- the columns; row-level security checks the states it writes. The
-- policies that restrict the client are RESTRICTIVE and name stint_client
-- alone; a permissive policy lets every other role do what its privileges
-- allow, and the table's owner, which the nodes usually connect as, is not
-- subject to row-level security at all, so a node's statements cost
-- nothing more.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        RAISE NOTICE 'stint: role stint_client does not exist; its row-level security is skipped';
        RETURN;
    END IF;
    REVOKE UPDATE (result, error) ON stint_task FROM stint_client;
    GRANT DELETE ON stint_task TO stint_client;
    GRANT UPDATE (children_pending, waiting_children, progress, parent_id) ON stint_task TO stint_client;
    GRANT INSERT, DELETE ON stint_hold TO stint_client;
    GRANT INSERT, UPDATE ON stint_behavior TO stint_client;

    ALTER TABLE stint_task ENABLE ROW LEVEL SECURITY;
    CREATE POLICY stint_any ON stint_task USING (true) WITH CHECK (true);
    CREATE POLICY stint_client_insert ON stint_task AS RESTRICTIVE FOR INSERT TO stint_client
        WITH CHECK (status = 'scheduled' AND lease IS NULL AND node IS NULL AND result IS NULL AND error IS NULL);
    -- A client's writes leave a task waiting (scheduled, held, or
    -- succeeded or failed and due again) or, for a submit during a run,
    -- running as it was; never finished for good.
    CREATE POLICY stint_client_update ON stint_task AS RESTRICTIVE FOR UPDATE TO stint_client
        USING (true)
        WITH CHECK (status IN ('scheduled', 'held', 'running') OR schedule_not_before IS NOT NULL);
END
$$;
