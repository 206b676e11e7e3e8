DROP FUNCTION stint_task_waits_ended(text[]);
ALTER TABLE stint_task DROP COLUMN waited_on, DROP COLUMN tasks_pending;
DROP TABLE stint_task_wait;
