ALTER TABLE stint_task DROP COLUMN debounce_since, DROP COLUMN debounce_deadline;
