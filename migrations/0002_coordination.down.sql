DROP TABLE IF EXISTS stint_behavior;
DROP TABLE IF EXISTS stint_hold;
DROP TABLE IF EXISTS stint_feed_consumer;
DROP TABLE IF EXISTS stint_feed_tick;
DROP TABLE IF EXISTS stint_change;
DROP INDEX IF EXISTS stint_task_group;
ALTER TABLE stint_task DROP COLUMN IF EXISTS waiting_children, DROP COLUMN IF EXISTS children_pending;
