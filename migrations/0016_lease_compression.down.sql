ALTER TABLE stint_lease ALTER COLUMN task_ids SET COMPRESSION default;
