-- The single dependencies go back to edge rows before their column goes.
INSERT INTO stint_dependency (depends_on, task_id)
SELECT depends_on, id FROM stint_task WHERE depends_on IS NOT NULL
ON CONFLICT DO NOTHING;
ALTER TABLE stint_node DROP COLUMN IF EXISTS reads_depends_on;
DROP INDEX IF EXISTS stint_task_depends_on;
ALTER TABLE stint_task DROP COLUMN IF EXISTS depends_on;
CREATE INDEX stint_task_created_old ON stint_task (behavior, created_at) WHERE retention_us IS NULL;
DROP INDEX stint_task_created;
ALTER INDEX stint_task_created_old RENAME TO stint_task_created;
