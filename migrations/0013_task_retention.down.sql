DROP INDEX stint_task_expiry;
DROP INDEX stint_task_created;
DROP FUNCTION stint_expiry(timestamptz, bigint);
ALTER TABLE stint_task DROP COLUMN retention_us;
