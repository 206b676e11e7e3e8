-- Claim hints of a paused behavior or a held group key are parked: they
-- leave the claim index, so that a claim never walks past them, however
-- many wait.
--
-- A hint is parked when its behavior is paused or its group key held as of
-- the statement that adds it, and pausing, resuming, holding and releasing
-- park and unpark the hints they concern. The statement that adds a hint
-- share-locks the pause or hold row it finds, so that a resume or release
-- waits for it to commit and then unparks its hint (or, if the resume or
-- release came first, sees the row gone or unpaused and leaves the hint in
-- the index). A hint added while a pause or hold commits may stay in the
-- index: the claim still leaves out paused behaviors and held keys, so such
-- a hint costs a claim a step and never runs a task early.
ALTER TABLE stint_due ADD COLUMN parked boolean NOT NULL DEFAULT false;
DROP INDEX stint_due_order;
CREATE INDEX stint_due_order ON stint_due (priority, due) WHERE NOT parked;
-- Which behaviors and keys are parked: without it the planner takes the
-- behaviors and keys of the parked hints to be spread over the claim index
-- as well, expects a claim to walk far to find its behaviors' hints, and
-- reads and sorts every due hint instead of the first few in the index.
CREATE STATISTICS stint_due_parked (mcv) ON parked, behavior, group_key FROM stint_due;

UPDATE stint_due d SET parked = true
WHERE EXISTS (SELECT 1 FROM stint_behavior b WHERE b.behavior = d.behavior AND b.paused)
   OR EXISTS (SELECT 1 FROM stint_hold h WHERE h.group_key = d.group_key);

-- A client adds hints and may pause and hold: it parks and unparks them,
-- and share-locks the pause and hold rows it finds when it adds one.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        GRANT UPDATE (parked) ON stint_due TO stint_client;
        GRANT UPDATE (group_key) ON stint_hold TO stint_client;
    END IF;
END
$$;
