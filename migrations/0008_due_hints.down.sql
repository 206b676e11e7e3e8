ALTER TABLE stint_task RESET (fillfactor);
DROP INDEX stint_task_group;
CREATE INDEX stint_task_group ON stint_task (group_key, status) WHERE group_key IS NOT NULL;
-- Running tasks were due at their lease expiry.
UPDATE stint_task t SET lost_not_before = l.expires_at, schedule_not_before = l.expires_at
FROM stint_lease l WHERE t.lease = l.lease AND t.status = 'running';
UPDATE stint_task SET schedule_not_before = lost_not_before
WHERE status = 'running' AND schedule_not_before IS DISTINCT FROM lost_not_before;
ALTER TABLE stint_task DROP CONSTRAINT stint_task_running;
ALTER TABLE stint_task ADD CONSTRAINT stint_task_running CHECK (status <> 'running' OR (
    executed_at IS NOT NULL AND lease IS NOT NULL AND lost_not_before > executed_at
    AND schedule_not_before = lost_not_before));
CREATE INDEX stint_task_claim ON stint_task (priority, schedule_not_before) WHERE schedule_not_before IS NOT NULL;
DROP TABLE stint_lease;
DROP TABLE stint_due;
