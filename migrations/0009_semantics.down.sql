ALTER TABLE stint_change DROP COLUMN progresses;
ALTER TABLE stint_task
    DROP COLUMN held_due,
    DROP COLUMN resubmit_due,
    DROP COLUMN resubmitted,
    DROP COLUMN progress_event_at;
