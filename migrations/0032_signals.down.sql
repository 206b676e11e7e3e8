ALTER TABLE stint_task DROP COLUMN signal_wait;
DROP TABLE stint_signal;
