ALTER TABLE stint_change
    ALTER COLUMN task_ids SET COMPRESSION pglz,
    ALTER COLUMN behaviors SET COMPRESSION pglz,
    ALTER COLUMN statuses SET COMPRESSION pglz,
    ALTER COLUMN parent_ids SET COMPRESSION pglz;

ALTER TABLE stint_task
    ALTER COLUMN id TYPE text COLLATE "default",
    ALTER COLUMN parent_id TYPE text COLLATE "default";
