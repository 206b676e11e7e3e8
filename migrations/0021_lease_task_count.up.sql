-- task_count is how many tasks a lease row names: cardinality(task_ids),
-- kept beside the array so that bounding a behavior's running tasks (every
-- claim under a cluster cap does) reads no compressed, out-of-line array. A
-- row written by a node from before this column has none: readers count its
-- array then.
ALTER TABLE stint_lease ADD COLUMN task_count integer;
UPDATE stint_lease SET task_count = cardinality(task_ids);
