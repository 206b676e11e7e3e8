DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        REVOKE UPDATE (parked) ON stint_due FROM stint_client;
        REVOKE UPDATE (group_key) ON stint_hold FROM stint_client;
    END IF;
END
$$;
DROP STATISTICS stint_due_parked;
DROP INDEX stint_due_order;
CREATE INDEX stint_due_order ON stint_due (priority, due);
ALTER TABLE stint_due DROP COLUMN parked;
