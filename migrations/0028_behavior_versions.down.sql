ALTER TABLE stint_node DROP COLUMN behavior_versions;
ALTER TABLE stint_task DROP COLUMN version;
