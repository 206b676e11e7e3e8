-- A workflow node with exactly one dependency when it was submitted keeps
-- that dependency's id in stint_task.depends_on instead of an edge row in
-- stint_dependency: the commonest shape (a chain's link, each node of a
-- fan-out) then writes one index entry where an edge wrote a row and two.
-- A node's dependencies are its depends_on and its edge rows together
-- (a node that a workflow's growth gives more dependencies at run time
-- keeps its depends_on and gets edge rows for the new ones).
ALTER TABLE stint_task ADD COLUMN depends_on text COLLATE "C";
-- The finish of a task finds the nodes that depend on it by this index.
CREATE INDEX stint_task_depends_on ON stint_task (depends_on) WHERE depends_on IS NOT NULL;

-- reads_depends_on says that the node's release reads depends_on. A
-- workflow is submitted with depends_on only while every registered node
-- does: a node of an earlier release, which reads edge rows alone, would
-- not wake such a node's dependents.
ALTER TABLE stint_node ADD COLUMN reads_depends_on boolean NOT NULL DEFAULT false;

-- stint_task_created is the index by age that cleanup walks for old
-- finished tasks. A workflow's nodes leave with their workflow, never by
-- their own age, so it leaves them out: a node writes one entry less.
CREATE INDEX stint_task_created_new ON stint_task (behavior, created_at)
    WHERE retention_us IS NULL AND workflow_node IS NULL;
DROP INDEX stint_task_created;
ALTER INDEX stint_task_created_new RENAME TO stint_task_created;
