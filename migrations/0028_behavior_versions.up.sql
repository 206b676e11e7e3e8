-- Behavior versions, for rolling deploys. A task records the version of
-- its behavior that submitted it (NULL: version 0, unversioned); a node
-- records the version of each behavior it runs (behavior_versions, a JSON
-- object of the non-zero ones). A node runs a task only when its version
-- of the behavior is the task's or newer, and gives any other back to the
-- nodes that know it.
ALTER TABLE stint_task ADD COLUMN version integer;
ALTER TABLE stint_node ADD COLUMN behavior_versions jsonb;

-- A client submits tasks, and a resubmit of a finished task takes the
-- submitter's version with its params.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        GRANT UPDATE (version) ON stint_task TO stint_client;
    END IF;
END
$$;
