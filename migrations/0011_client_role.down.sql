DROP POLICY IF EXISTS stint_client_update ON stint_task;
DROP POLICY IF EXISTS stint_client_insert ON stint_task;
DROP POLICY IF EXISTS stint_any ON stint_task;
ALTER TABLE stint_task DISABLE ROW LEVEL SECURITY;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        REVOKE DELETE ON stint_task FROM stint_client;
        REVOKE UPDATE (children_pending, waiting_children, progress, parent_id) ON stint_task FROM stint_client;
        REVOKE INSERT, DELETE ON stint_hold FROM stint_client;
        REVOKE INSERT, UPDATE ON stint_behavior FROM stint_client;
        GRANT UPDATE (result, error) ON stint_task TO stint_client;
    END IF;
END
$$;
