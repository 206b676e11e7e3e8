-- Debounced submits (api.Debounce). A task's debounce cycle began at
-- debounce_since (the time of its first debounced submit, from the
-- database's clock) and postpones the task no later than
-- debounce_deadline. A cycle that began before the task's last run
-- started (debounce_since < executed_at) has ended: the next debounced
-- submit begins another. NULL: no debounced submit.
ALTER TABLE stint_task ADD COLUMN debounce_since timestamptz, ADD COLUMN debounce_deadline timestamptz;

-- A client submits tasks, and a debounced submit sets the cycle of the
-- task it changes.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        GRANT UPDATE (debounce_since, debounce_deadline) ON stint_task TO stint_client;
    END IF;
END
$$;
