-- Flow control: named rate limits with the state of their keys, caps on
-- running tasks set at runtime, and what a task uses and waits on.
--
-- stint_rate_limit holds each rate limit: lim units per period_us
-- microseconds, also the burst (see api.RateLimit for the rule).
CREATE TABLE stint_rate_limit (
    name text PRIMARY KEY CONSTRAINT stint_rate_limit_name CHECK (length(name) BETWEEN 1 AND 128),
    lim bigint NOT NULL CONSTRAINT stint_rate_limit_lim CHECK (lim >= 1),
    period_us bigint NOT NULL CONSTRAINT stint_rate_limit_period CHECK (period_us >= 1000),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- stint_rate_key is the GCRA state of each key of a limit that started a
-- task: tat, the theoretical arrival time, is when the key's budget is
-- full again, exactly: tat plus frac/frac_lim microseconds (a unit is
-- period/lim, rarely a whole microsecond). A key without a row, or with
-- tat in the past, has its whole budget. planned is when the tasks that
-- claims held back (and moved to the time the limit admits them) will
-- have spent the budget: the next task held back is moved after them.
-- Claims lock a key (an advisory lock) before they read and move its
-- state, so that no two claims spend the same budget.
CREATE TABLE stint_rate_key (
    name text NOT NULL REFERENCES stint_rate_limit (name) ON DELETE CASCADE,
    key text NOT NULL,
    tat timestamptz NOT NULL,
    frac bigint NOT NULL DEFAULT 0,
    frac_lim bigint NOT NULL DEFAULT 1,
    planned timestamptz,
    PRIMARY KEY (name, key)
);

-- stint_concurrency holds the caps set at runtime: the cap of a group key
-- of a behavior (an override of the policy's GroupConcurrency; max 0
-- keeps the policy's and sets the key's fair-share weight alone), or, with
-- key '', the cap on all the behavior's running tasks across the cluster.
CREATE TABLE stint_concurrency (
    behavior text NOT NULL,
    key text NOT NULL,
    max integer NOT NULL CONSTRAINT stint_concurrency_max CHECK (max >= 0),
    weight integer NOT NULL DEFAULT 1 CONSTRAINT stint_concurrency_weight CHECK (weight >= 1),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (behavior, key),
    CONSTRAINT stint_concurrency_cluster CHECK (key <> '' OR (max >= 1 AND weight = 1))
);

-- rate_uses are the rate limits a task consumes when it starts, as the
-- behavior derived them at submit: [{"l": limit, "k": key, "u": units}].
-- waiting is what a due task waits on when a rate limit held it back
-- ({"reason", "limit", "key", "until"}, an api.Wait); a claim clears it.
-- Neither column is in an index a claim or finish changes, so those stay
-- HOT updates; stint_task_waiting holds only the waiting tasks.
ALTER TABLE stint_task ADD COLUMN rate_uses jsonb, ADD COLUMN waiting jsonb;
CREATE INDEX stint_task_waiting ON stint_task ((waiting->>'limit'), (waiting->>'key')) WHERE waiting IS NOT NULL;

-- A lease row names the behavior of its tasks (a claim or local start
-- issues one lease per behavior), so that the running tasks of a capped
-- behavior are counted from its leases alone: one index probe per lease,
-- one primary-key lookup per task. Rows from before have theirs filled in.
ALTER TABLE stint_lease ADD COLUMN behavior text;
UPDATE stint_lease l SET behavior = t.behavior FROM stint_task t WHERE t.id = l.task_ids[1];
CREATE INDEX stint_lease_behavior ON stint_lease (behavior);

-- stint_due_key finds the first due hints of each group key of a
-- behavior, for claims with fair share (spi.Policy.FairShare): they walk
-- the keys that have hints (a skip scan) and take each key's first ones.
-- Only hints with a group key are in it, so tasks without one cost
-- nothing more to submit or claim.
CREATE INDEX stint_due_key ON stint_due (behavior, group_key, priority, due) WHERE NOT parked AND group_key IS NOT NULL;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_rate_limit, stint_rate_key, stint_concurrency TO stint_node;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        -- Clients submit (which stores a declared limit the first time a
        -- task names it) and change limits as operators; only nodes start
        -- tasks, so only they spend a key's budget.
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_rate_limit, stint_concurrency TO stint_client;
        -- A change of a limit rescales its keys' spent budget and makes
        -- the tasks it held back due again (they are weighed anew).
        GRANT SELECT, DELETE ON stint_rate_key TO stint_client;
        GRANT UPDATE (tat, frac, frac_lim, planned) ON stint_rate_key TO stint_client;
        GRANT UPDATE (rate_uses, waiting) ON stint_task TO stint_client;
    END IF;
END
$$;
