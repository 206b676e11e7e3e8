-- The index that claims under caps per group key walk, key by key, and
-- the one that counts a behavior's lease rows keep one entry per row,
-- not a posting list of the rows with equal keys (btree deduplication).
-- Hints and lease rows live for moments: a claim deletes the first hints
-- of each key and a finish its lease rows, and a scan that meets a deleted
-- row's entry marks it dead, so that the scans after it pass it without
-- reading the row, until vacuum removes it. A posting list is marked only
-- once every row in it is deleted, and the tasks of one submit share
-- their keys (behavior, group key, priority and due time): each claim read
-- again the deleted rows of the lists the claims before it had begun,
-- several hundred rows per key. The claim index in pickup order
-- (stint_due_order) keeps its lists: a plain claim takes a list's rows
-- in one go, and a burst of submits ran a tenth slower without them.
-- Entries written before this migration keep their lists until vacuum
-- removes them.
ALTER INDEX stint_due_key SET (deduplicate_items = off);
ALTER INDEX stint_lease_behavior SET (deduplicate_items = off);
