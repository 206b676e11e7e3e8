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

// The floor works a table of stint_task's shape (its columns and claim
// index, no CHECK constraints) with nothing but the three statements a queue
// cannot do without: a batched insert, a claim and a completion.
const (
	floorDDL = `
CREATE TABLE floor_task (LIKE stint_task INCLUDING DEFAULTS);
ALTER TABLE floor_task ADD PRIMARY KEY (id);
CREATE INDEX floor_task_claim ON floor_task (priority, schedule_not_before) WHERE schedule_not_before IS NOT NULL;`

	floorInsertSQL = `
INSERT INTO floor_task (id, behavior, params, schedule_not_before)
SELECT id, 'bench.noop', '{}', now() FROM unnest($1::text[]) AS id`

	floorClaimSQL = `
UPDATE floor_task t SET
    status = 'running', lease = gen_random_uuid(), node = $1, attempt = t.attempt + 1,
    executed_at = now(), lost_not_before = now() + interval '5 minutes',
    schedule_not_before = now() + interval '5 minutes', updated_at = now()
WHERE t.id IN (
    SELECT id FROM floor_task WHERE schedule_not_before <= now()
    ORDER BY priority, schedule_not_before LIMIT $2 FOR UPDATE SKIP LOCKED)
RETURNING t.id, t.lease, t.params`

	floorCompleteSQL = `
UPDATE floor_task t SET
    status = 'success', result = '{}', schedule_not_before = NULL, lost_not_before = NULL,
    finished_at = now(), updated_at = now()
FROM unnest($1::text[], $2::uuid[]) AS c(id, lease)
WHERE t.id = c.id AND t.lease = c.lease AND t.status = 'running'`
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
		rows, err := pool.Query(ctx, floorClaimSQL, node, limit)
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
		if _, err := pool.Exec(ctx, floorCompleteSQL, ids, leases); err != nil {
			return fmt.Errorf("floor: complete: %w", err)
		}
	}
}
