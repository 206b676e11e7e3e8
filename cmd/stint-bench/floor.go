package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/store/postgres"
)

// The floor works stint's layout (migration 0008) with nothing but the
// three statements a queue cannot do without: a batched insert of tasks and
// their claim hints, a claim that takes hints and updates their tasks under
// one lease row, and a completion. It has stint's tables, fillfactor and
// indexes, and none of its constraints, feed or notifications.
const (
	floorDDL = `
CREATE TABLE floor_task (LIKE stint_task INCLUDING DEFAULTS) WITH (fillfactor = 30);
ALTER TABLE floor_task ADD PRIMARY KEY (id);
CREATE INDEX floor_task_parent ON floor_task (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX floor_task_group ON floor_task (group_key) WHERE group_key IS NOT NULL;
CREATE TABLE floor_due (LIKE stint_due INCLUDING DEFAULTS);
CREATE INDEX floor_due_order ON floor_due (priority, due);
CREATE TABLE floor_lease (LIKE stint_lease);
ALTER TABLE floor_lease ADD PRIMARY KEY (lease);
CREATE INDEX floor_lease_expiry ON floor_lease (expires_at);`

	floorInsertSQL = `
WITH t AS (
    INSERT INTO floor_task (id, behavior, params, schedule_not_before)
    SELECT id, 'bench.noop', '{}', now() FROM unnest($1::text[]) AS id
    RETURNING id, behavior, priority, schedule_not_before)
INSERT INTO floor_due (id, behavior, priority, due) SELECT id, behavior, priority, schedule_not_before FROM t`

	floorClaimSQL = `
WITH hint AS (
    DELETE FROM floor_due d WHERE d.ctid = ANY(ARRAY(
        SELECT ctid FROM floor_due WHERE due <= now() ORDER BY priority, due LIMIT $2 FOR UPDATE SKIP LOCKED))
    RETURNING d.id
), claimed AS (
    UPDATE floor_task t SET
        status = 'running', lease = $3, node = $1, attempt = t.attempt + 1,
        executed_at = now(), lost_not_before = now() + interval '5 minutes',
        schedule_not_before = now() + interval '5 minutes', updated_at = now()
    FROM hint WHERE t.id = hint.id
    RETURNING t.id, t.lease, t.params
), lease AS (
    INSERT INTO floor_lease (lease, node, expires_at, task_ids)
    SELECT $3, $1, now() + interval '5 minutes', array_agg(id) FROM claimed HAVING count(*) > 0
)
SELECT id, lease, params FROM claimed`

	floorCompleteSQL = `
WITH done AS (
    UPDATE floor_task t SET
        status = 'success', result = '{}', schedule_not_before = NULL, lost_not_before = NULL,
        finished_at = now(), updated_at = now()
    FROM unnest($1::text[], $2::uuid[]) AS c(id, lease)
    WHERE t.id = c.id AND t.lease = c.lease AND t.status = 'running'
    RETURNING 1)
DELETE FROM floor_lease WHERE lease = $3`
)

// floorRun inserts cfg.floorN rows in batches of cfg.batch with one unnest
// statement each, then cfg.floorWorkers goroutines claim cfg.floorClaim rows
// at a time and complete them until none is left.
func (b *bench) floorRun(ctx context.Context) ([]Result, error) {
	dsn, err := b.db.newDB(ctx, "floor")
	if err != nil {
		return nil, err
	}
	// stint's schema gives the table its shape.
	st, err := postgres.Open(ctx, dsn, postgres.Migrate())
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	st.Close()
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("floor: parse DSN: %w", err)
	}
	pcfg.MaxConns = int32(b.cfg.floorWorkers + 1)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("floor: open pool: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, floorDDL); err != nil {
		return nil, fmt.Errorf("floor: create table: %w", err)
	}

	n := b.cfg.floorN
	win := begin()
	start := win.start
	ids := make([]string, 0, b.cfg.batch)
	for left := n; left > 0; {
		k := min(left, b.cfg.batch)
		ids = ids[:0]
		for range k {
			ids = append(ids, uuid.Must(uuid.NewV7()).String())
		}
		if _, err := pool.Exec(ctx, floorInsertSQL, ids); err != nil {
			return nil, fmt.Errorf("floor: insert: %w", err)
		}
		left -= k
	}
	insertSecs, insertCPU := time.Since(start).Seconds(), win.usage()

	b.resetStatements(ctx)
	win = begin()
	start = win.start
	errs := make([]error, b.cfg.floorWorkers)
	var wg sync.WaitGroup
	for w := range b.cfg.floorWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = floorWorker(ctx, pool, fmt.Sprintf("floor-%d", w), b.cfg.floorClaim)
		}()
	}
	wg.Wait()
	end, cpu := time.Now(), win.usage()
	b.collectStatements(ctx, "floor burn-down work", dsn, end.Sub(start))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := checkCompleted(ctx, pool, `SELECT count(*) FROM floor_task WHERE status = 'success'`, int64(n)); err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	return []Result{
		{Scenario: "burn-down", Metric: "insert", System: sysFloor, Tasks: int64(n), Seconds: insertSecs, CPU: insertCPU},
		{Scenario: "burn-down", Metric: "work", System: sysFloor, Tasks: int64(n), Seconds: end.Sub(start).Seconds(), CPU: cpu},
	}, nil
}

// floorWorker claims and completes rows until a claim finds none. A row
// another worker has locked is that worker's to complete.
func floorWorker(ctx context.Context, pool *pgxpool.Pool, node string, limit int) error {
	ids := make([]string, 0, limit)
	leases := make([][16]byte, 0, limit)
	for {
		ids, leases = ids[:0], leases[:0]
		token := uuid.New()
		rows, err := pool.Query(ctx, floorClaimSQL, node, limit, token)
		if err != nil {
			return fmt.Errorf("floor: claim: %w", err)
		}
		var id string
		var lease [16]byte
		var params []byte
		if _, err := pgx.ForEachRow(rows, []any{&id, &lease, &params}, func() error {
			ids, leases = append(ids, id), append(leases, lease)
			return nil
		}); err != nil {
			return fmt.Errorf("floor: claim: %w", err)
		}
		if len(ids) == 0 {
			return nil
		}
		if _, err := pool.Exec(ctx, floorCompleteSQL, ids, leases, token); err != nil {
			return fmt.Errorf("floor: complete: %w", err)
		}
	}
}
