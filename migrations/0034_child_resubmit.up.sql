-- A submit may not run again a child task that ended for good: its end
-- was counted off its parent, and its next end would count it off again
-- and could wake the parent while a sibling still ran. Retry it instead
-- (one that failed), which makes the parent wait for it once more. Only its parent's run,
-- spawning it again, resubmits it (and counts it pending again).
-- stint_submit_refused gains the message of that refusal; its other
-- cases are as before, so nodes of the release before keep working.
CREATE OR REPLACE FUNCTION stint_submit_refused(task_id text, stored text, submitted text, node text, workflow text)
RETURNS text LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF stored = 'stint.workflow' THEN
        RAISE EXCEPTION 'task % is a workflow: submit a workflow of another id, or retry, cancel or remove this one', task_id
            USING ERRCODE = 'SX409';
    ELSIF stored <> submitted THEN
        RAISE EXCEPTION 'task % is of behavior %, not %: a submit may not change a task of another behavior', task_id, stored, submitted
            USING ERRCODE = 'SX409';
    ELSIF node IS NULL THEN
        RAISE EXCEPTION 'task % is a child of task % and has ended, which its parent counted: retry it (if it failed) to run it again for its parent, or submit another id', task_id, workflow
            USING ERRCODE = 'SX409';
    ELSE
        RAISE EXCEPTION 'task % is node % of workflow %: retry the node or the workflow instead of submitting it again', task_id, node, workflow
            USING ERRCODE = 'SX409';
    END IF;
END
$$;
