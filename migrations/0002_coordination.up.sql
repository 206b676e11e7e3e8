-- Children: a parent counts its unfinished children and may wait for them
-- without holding a worker; the finish of the last child makes it due.
ALTER TABLE stint_task
    ADD COLUMN children_pending integer NOT NULL DEFAULT 0,
    ADD COLUMN waiting_children boolean NOT NULL DEFAULT false;

CREATE INDEX stint_task_group ON stint_task (group_key, status) WHERE group_key IS NOT NULL;

-- stint_change is the change feed (couch_event): the state changes of
-- tasks, one row per statement that changed them (a claim of 1,000 tasks is
-- one row), so that the feed costs little on the hot path. Sequence numbers
-- alone cannot be a reader's cursor (a transaction can commit a smaller seq
-- after a reader passed a larger one), so readers move from tick to tick: a
-- tick records a snapshot, and the changes between two ticks are those whose
-- transaction is visible in the second snapshot and not in the first (PgQ's
-- batches). Within a batch, seq and the array position order them; a task's
-- changes are always in order, since each waits for the row lock of the one
-- before.
CREATE TABLE stint_change (
    seq        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    xid        xid8        NOT NULL DEFAULT pg_current_xact_id(),
    task_ids   text[]      NOT NULL,
    behaviors  text[]      NOT NULL,
    statuses   text[]      NOT NULL,
    parent_ids text[]      NOT NULL,
    -- finals mark tasks finished for good (or removed): nothing follows.
    finals     boolean[]   NOT NULL,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stint_change_xid ON stint_change (xid);

CREATE TABLE stint_feed_tick (
    tick bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    snap pg_snapshot NOT NULL,
    at   timestamptz NOT NULL DEFAULT now()
);

-- stint_feed_consumer holds the named readers of the change feed: the tick
-- each has read to, and when it last showed it is alive. The feed is kept
-- for the slowest live consumer.
CREATE TABLE stint_feed_consumer (
    name         text        PRIMARY KEY,
    tick         bigint      NOT NULL DEFAULT 0,
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- stint_hold lists held group keys: no task of a held key is claimed.
CREATE TABLE stint_hold (
    group_key  text        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- stint_behavior holds settings of a behavior that operators change at
-- runtime, for all nodes: a paused behavior is not claimed; lease overrides
-- the behavior's policy (couch_jobs' per-type activity timeout).
CREATE TABLE stint_behavior (
    behavior   text        PRIMARY KEY,
    paused     boolean     NOT NULL DEFAULT false,
    lease_ms   bigint      CHECK (lease_ms IS NULL OR lease_ms >= 1000),
    updated_at timestamptz NOT NULL DEFAULT now()
);
