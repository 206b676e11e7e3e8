-- version is the stint version a node runs (its module version, and the
-- commit when the build names one), written when it registers. A node from
-- before this column leaves it null.
ALTER TABLE stint_node ADD COLUMN version text;
