CREATE OR REPLACE FUNCTION stint_submit_refused(task_id text, stored text, submitted text, node text, workflow text)
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
