-- A retention per task, and indexes that serve the cleanup's deletes.
--
-- retention_us keeps a task this long (in microseconds) after it finished
-- for good, whatever its outcome, instead of its behavior's retention;
-- NULL leaves it to the behavior.
--
-- Neither index covers a column that a claim or a finish changes (status,
-- schedule_not_before, finished_at...), so both stay HOT updates. They
-- index created_at instead, which never changes: a task that finished
-- longer ago than its retention was created longer ago still, so the
-- cleanup's range on created_at holds every task it may delete, and it
-- checks the rest (finished for good, and when) on the rows of that range.
ALTER TABLE stint_task ADD COLUMN retention_us bigint
    CONSTRAINT stint_task_retention CHECK (retention_us > 0);

-- stint_expiry is when, at the earliest, a task created at created and kept
-- retention_us after its end may be deleted. It is immutable (unlike
-- timestamptz + interval in general): an interval of microseconds alone
-- does not depend on the time zone, so an index may hold it.
CREATE FUNCTION stint_expiry(created timestamptz, retention_us bigint) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT created + retention_us * interval '1 microsecond' $$;

-- The tasks kept as their behavior says, by behavior and age.
CREATE INDEX stint_task_created ON stint_task (behavior, created_at) WHERE retention_us IS NULL;
-- The tasks with their own retention, by the earliest time they may go.
CREATE INDEX stint_task_expiry ON stint_task (stint_expiry(created_at, retention_us)) WHERE retention_us IS NOT NULL;
