-- A node reports its database incidents with its heartbeat: those going on
-- (only a failing listener lets it write them while they last) and the last
-- one that ended, as JSON ({cause, started, ended, failures, error}, in an array
-- for those going on).
ALTER TABLE stint_node ADD COLUMN incidents jsonb, ADD COLUMN last_incident jsonb;
