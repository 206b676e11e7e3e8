-- Waits on tasks (spi.WaitForTasks): a run sleeps, holding neither worker
-- nor lease, until every task of a set ended for good. A row says that the
-- run of waiter under lease waits for target; the waiter's tasks_pending
-- counts its rows of that lease whose target has not ended. The
-- registration locks the targets (in id order) and sets their waited_on,
-- so the finish of a target nobody waits on costs nothing more. The
-- statement that ends a waited-on target for good deletes its rows
-- through stint_task_waits_ended (whose fresh snapshot sees the rows of a
-- registration that committed while the statement ran) and counts them
-- off their waiters: the waiter row's lock orders such counts, and the one
-- that brings it to zero makes the waiter due. A row of an earlier lease
-- (a wait that passed its longest, a run taken over) counts for nothing,
-- and goes with its target's end or with its waiter or target.
CREATE TABLE stint_task_wait (
    waiter text COLLATE "C" NOT NULL,
    target text COLLATE "C" NOT NULL,
    lease  uuid NOT NULL,
    PRIMARY KEY (waiter, target)
);

CREATE INDEX stint_task_wait_target ON stint_task_wait (target);

-- waited_on: a registration found the task not ended and waits for it.
-- tasks_pending: the waits of the task's run on tasks not ended yet, set
-- by the run's registration and cleared by the next claim.
ALTER TABLE stint_task
    ADD COLUMN waited_on boolean NOT NULL DEFAULT false,
    ADD COLUMN tasks_pending integer;

-- stint_task_waits_ended deletes the waits on the tasks targets and
-- returns their waiters with the leases they waited under. Being volatile,
-- it reads with a snapshot of its own, taken when it is called: the
-- statement that calls it may have started before a registration on one
-- of targets committed, and found the target's new version (waited_on
-- set) under its row lock, but not the registration's rows.
CREATE FUNCTION stint_task_waits_ended(targets text[]) RETURNS TABLE (waiter text, lease uuid)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY DELETE FROM stint_task_wait w WHERE w.target = ANY(targets) RETURNING w.waiter, w.lease;
END
$$;

-- Nodes register waits, end them and delete them with their tasks;
-- clients end them when they fail, cancel or remove a task, which may wake
-- its waiters.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_task_wait TO stint_node;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_client') THEN
        GRANT SELECT, DELETE ON stint_task_wait TO stint_client;
        GRANT UPDATE (tasks_pending, waited_on) ON stint_task TO stint_client;
    END IF;
END
$$;
