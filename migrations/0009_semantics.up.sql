-- Columns that keep what an admin action or a resubmit asked for until the
-- moment it applies.
--
-- held_due is the due time a held task had when it was held (or the time
-- its last child ended while it was held): Release makes it due then, or
-- at once if that time has passed. resubmit_due is the due time a submit
-- asked for while the task ran: the finish of that run schedules the task
-- for it. progress_event_at is when a checkpoint last recorded a progress
-- event in the change feed, so that a fast checkpointer sends at most one
-- per task and second. resubmitted marks a run that a resubmit asked for:
-- a claim moves the resubmit flag (a resubmit is pending) into it.
ALTER TABLE stint_task
    ADD COLUMN held_due timestamptz,
    ADD COLUMN resubmit_due timestamptz,
    ADD COLUMN resubmitted boolean NOT NULL DEFAULT false,
    ADD COLUMN progress_event_at timestamptz;

-- A held parent may wait for children: it stays held when they end.
UPDATE stint_task SET waiting_children = false WHERE status = 'held' AND waiting_children AND children_pending <= 0;

-- Progress events carry the progress they announce, at their array
-- position; other rows of the feed leave it NULL.
ALTER TABLE stint_change ADD COLUMN progresses jsonb[];

-- A submit sets resubmit_due and a hold held_due, as they set the due time.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        GRANT UPDATE (resubmit_due, held_due) ON stint_task TO stint_client;
    END IF;
END
$$;
