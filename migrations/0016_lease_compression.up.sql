-- A lease row's task ids (one per task of its claim, a thousand for a full
-- claim) are compressed on every claim: lz4 does it several times faster
-- than the default pglz, which took more of a claim's time than the lease
-- row's insert otherwise. A server built without lz4 keeps pglz.
DO $$
BEGIN
    ALTER TABLE stint_lease ALTER COLUMN task_ids SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'stint: this server has no lz4; lease task ids stay compressed with pglz';
END
$$;
