ALTER TABLE stint_lease DROP COLUMN IF EXISTS task_count;
