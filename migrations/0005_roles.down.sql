-- The roles are cluster-wide and may serve other databases: only this
-- database's grants are revoked.
DO $$
DECLARE
    t text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node') AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE 'stint\_%' LOOP
            EXECUTE format('REVOKE ALL ON %I FROM stint_node, stint_client', t);
        END LOOP;
        EXECUTE 'REVOKE ALL ON ALL SEQUENCES IN SCHEMA ' || quote_ident(current_schema()) || ' FROM stint_node, stint_client';
    END IF;
END
$$;
