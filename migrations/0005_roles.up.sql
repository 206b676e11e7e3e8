-- Least-privilege roles (NOLOGIN; grant them to your login roles):
--   stint_node   runs tasks: reads and writes stint's tables.
--   stint_client submits and reads: it may insert tasks and change the
--                columns a submit changes, never a lease, node or lease
--                expiry, so it can neither claim nor finish a task.
-- Roles are cluster-wide: creating them needs CREATEROLE, and they may
-- exist already (another database, a concurrent migrator). Without the
-- privilege the roles are skipped with a notice and the grants with them.
DO $$
DECLARE
    r text;
    t text;
BEGIN
    FOREACH r IN ARRAY ARRAY['stint_node', 'stint_client'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN NULL;
                WHEN insufficient_privilege THEN
                    RAISE NOTICE 'stint: no CREATEROLE privilege; roles stint_node and stint_client not created';
                    RETURN;
            END;
        END IF;
    END LOOP;

    FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE 'stint\_%' LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO stint_node', t);
    END LOOP;
    EXECUTE 'GRANT USAGE ON ALL SEQUENCES IN SCHEMA ' || quote_ident(current_schema()) || ' TO stint_node, stint_client';

    GRANT SELECT, INSERT ON stint_task TO stint_client;
    GRANT UPDATE (status, params, priority, schedule_not_before, resubmit, awaited, attempt, errors,
                  result, error, executed_at, finished_at, updated_at) ON stint_task TO stint_client;
    GRANT SELECT, INSERT ON stint_change, stint_feed_tick TO stint_client;
    GRANT SELECT ON stint_node, stint_behavior, stint_hold TO stint_client;
    GRANT SELECT, INSERT, UPDATE ON stint_feed_consumer TO stint_client;
END
$$;
