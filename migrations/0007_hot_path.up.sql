-- Task ids compare byte by byte. Under any other collation every comparison
-- in the primary key (each submit, claim and finish walks it) goes through
-- strcoll; ids are opaque strings that need no linguistic order, and byte
-- order is the same everywhere.
ALTER TABLE stint_task
    ALTER COLUMN id TYPE text COLLATE "C",
    ALTER COLUMN parent_id TYPE text COLLATE "C";

-- The feed's arrays hold a statement's worth of ids (thousands for a bulk
-- submit) and are compressed on the hot path: lz4 does it several times
-- faster than the default pglz. A server built without lz4 keeps pglz.
DO $$
BEGIN
    ALTER TABLE stint_change
        ALTER COLUMN task_ids SET COMPRESSION lz4,
        ALTER COLUMN behaviors SET COMPRESSION lz4,
        ALTER COLUMN statuses SET COMPRESSION lz4,
        ALTER COLUMN parent_ids SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'stint: this server has no lz4; the change feed stays compressed with pglz';
END
$$;
