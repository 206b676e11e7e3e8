DROP INDEX IF EXISTS stint_due_key;
DROP INDEX IF EXISTS stint_lease_behavior;
ALTER TABLE stint_lease DROP COLUMN IF EXISTS behavior;
DROP INDEX IF EXISTS stint_task_waiting;
ALTER TABLE stint_task DROP COLUMN IF EXISTS rate_uses, DROP COLUMN IF EXISTS waiting;
DROP TABLE IF EXISTS stint_concurrency;
DROP TABLE IF EXISTS stint_rate_key;
DROP TABLE IF EXISTS stint_rate_limit;
