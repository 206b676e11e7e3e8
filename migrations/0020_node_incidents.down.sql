ALTER TABLE stint_node DROP COLUMN IF EXISTS incidents, DROP COLUMN IF EXISTS last_incident;
