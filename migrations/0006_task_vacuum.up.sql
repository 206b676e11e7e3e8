-- stint_task is a queue table: every task is updated three or more times
-- and the claim index walks the dead entries those updates leave behind.
-- Vacuum it after 1% of its rows changed (the default waits for 20%) and
-- without the cost-based pauses, so claims do not slow down after bulk
-- finishes or deletes.
ALTER TABLE stint_task SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
