-- The feed's finals and progresses arrays join the others on lz4: a
-- claim's or finish's feed row carries one final flag per task, and pglz
-- compressing it took more CPU than the row's other arrays together. A
-- server built without lz4 keeps pglz.
DO $$
BEGIN
    ALTER TABLE stint_change
        ALTER COLUMN finals SET COMPRESSION lz4,
        ALTER COLUMN progresses SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'stint: this server has no lz4; the change feed stays compressed with pglz';
END
$$;
