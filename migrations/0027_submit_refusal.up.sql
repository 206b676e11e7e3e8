-- stint_submit_refused ends a submit that would change a task it may not
-- change: a task of another behavior, a workflow's own task, or a node of
-- a workflow (whose runs its workflow's rules decide: retry the node or
-- the workflow instead). A submit statement calls it from its conflict
-- clause for such a task, so that the whole statement fails and stores
-- nothing. Its SQLSTATE, SX409, is the one the store maps to a conflict.
CREATE FUNCTION stint_submit_refused(task_id text, stored text, submitted text, node text, workflow text)
RETURNS text LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF stored = 'stint.workflow' THEN
        RAISE EXCEPTION 'task % is a workflow: submit a workflow of another id, or retry, cancel or remove this one', task_id
            USING ERRCODE = 'SX409';
    ELSIF stored <> submitted THEN
        RAISE EXCEPTION 'task % is of behavior %, not %: a submit may not change a task of another behavior', task_id, stored, submitted
            USING ERRCODE = 'SX409';
    ELSE
        RAISE EXCEPTION 'task % is node % of workflow %: retry the node or the workflow instead of submitting it again', task_id, node, workflow
            USING ERRCODE = 'SX409';
    END IF;
END
$$;
