ALTER INDEX IF EXISTS stint_due_key RESET (deduplicate_items);
ALTER INDEX IF EXISTS stint_lease_behavior RESET (deduplicate_items);
