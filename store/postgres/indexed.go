package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The hot statements run with sequential scans off (enable_seqscan), set
// for their transaction alone in the same round trip.
//
// The planner takes a table's size in pages as it is now, but its number
// of rows per page from its last analyze, and a prepared statement's
// generic plan is made once per connection. A plan made while the queue
// was empty, or after an analyze found it empty, reads tasks, claim hints
// and leases by sequential scans, and a connection keeps that plan for as
// long as it lives: each statement then costs more as the tables grow (a
// finish of 1,000 tasks scanned all the tasks). Each hot statement gives
// each of those tables an index condition (a primary key, a behavior, a
// lease expiry), so that with sequential scans off the planner has only
// index paths left, whatever the statistics say;
// TestHotStatementsStayIndexDriven checks them. The setting is made with
// set_config(..., true), scoped to the transaction, so that a pooler in
// transaction mode never carries it to another client.
//
// A hot statement matches the rows of stint_task and stint_lease to the
// rows of its input (a claim's hints, a finish's completions) as
// t.id = ANY(ARRAY[input.id]), not t.id = input.id: such a condition
// drives a probe of the primary key per input row but can be neither a
// hash nor a merge join's clause, so that with sequential scans off a
// nested loop from the input into the primary key is the only plan. With
// t.id = input.id, plans made on empty tables joined the input to a walk
// of the whole primary key (whose order suits a merge join), or to a
// sequential scan per input row.
const (
	// seqscanOffSQL turns sequential scans off for the transaction.
	seqscanOffSQL = `SELECT set_config('enable_seqscan', 'off', true)`
	// seqscanSaveOffSQL does it in a caller's transaction, keeping the
	// caller's setting for seqscanRestoreSQL.
	seqscanSaveOffSQL = `SELECT set_config('stint.enable_seqscan', current_setting('enable_seqscan'), true),
    set_config('enable_seqscan', 'off', true)`
	// seqscanRestoreSQL gives a caller's transaction its setting back.
	seqscanRestoreSQL = `SELECT set_config('enable_seqscan', current_setting('stint.enable_seqscan'), true)`

	// probesSaveOffSQL is seqscanSaveOffSQL with bitmap scans off too,
	// for a statement that probes an index once per input row where the
	// planner, without statistics, expects dozens of rows per probe:
	// depsEndedSQL reads the edges of each ended task, which in a fan-in
	// are one, and a bitmap scan per probe cost half again what an index
	// scan does. A fan-out root's 10,000 edges are read as quickly by an
	// index scan.
	probesSaveOffSQL = `SELECT set_config('stint.enable_seqscan', current_setting('enable_seqscan'), true),
    set_config('stint.enable_bitmapscan', current_setting('enable_bitmapscan'), true),
    set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`
	// probesRestoreSQL gives a caller's transaction its settings back.
	probesRestoreSQL = `SELECT set_config('enable_seqscan', current_setting('stint.enable_seqscan'), true),
    set_config('enable_bitmapscan', current_setting('stint.enable_bitmapscan'), true)`
)

// genericSettingsSQL is seqscanOffSQL with plan_cache_mode
// force_generic_plan, for the statements that PostgreSQL would otherwise
// plan anew at each execution: the starting submit statements
// (submitStartSQL, shareStartSQL, newStartSQL), a small finish's
// (finishSQL, childrenEndedSQL, depsEndedSQL; see finishBatch), the
// signals' (signalLock, signalSQL) and the submit of workflows (workflowSubmitSQL: a batch of 10 diamonds planned
// for 0.8 ms and ran for 1.6).
// PostgreSQL plans a prepared statement anew each time its plan for the
// parameters looks cheaper than the generic one, and for these it always
// did: pg_prepared_statements counted a custom plan for every execution
// of the starting submits and never a generic one, and the planning of
// their subqueries took about as long as their execution; a workflow
// node's finish spent 1.5 of its 4.5 ms planning. Their generic plans are
// index-driven as the custom ones are (TestHotStatementsStayIndexDriven
// checks both).
const genericSettingsSQL = `SELECT set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)`

// batcher sends batches: the pool, a connection or a transaction.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// indexed runs the statement sql with args on db with sequential scans
// off, in one round trip. On the pool, the batch is one implicit
// transaction that the setting ends with; in a transaction (a caller's, or
// one of the store's), the setting is put back after the statement, so
// that the caller's own statements are planned as before. read, if not
// nil, reads the statement's rows.
func indexed(ctx context.Context, db batcher, read func(pgx.Rows) error, sql string, args ...any) (pgconn.CommandTag, error) {
	return indexedWith(ctx, db, seqscanOffSQL, read, sql, args...)
}

// indexedWith is indexed with settings, a statement of set_config calls
// scoped to the transaction, in place of seqscanOffSQL outside a
// transaction; in a transaction it runs the statement as indexed does.
func indexedWith(ctx context.Context, db batcher, settings string, read func(pgx.Rows) error, sql string, args ...any) (pgconn.CommandTag, error) {
	_, inTx := db.(pgx.Tx)
	batch := &pgx.Batch{}
	if inTx {
		batch.Queue(seqscanSaveOffSQL)
	} else {
		batch.Queue(settings)
	}
	batch.Queue(sql, args...)
	if inTx {
		batch.Queue(seqscanRestoreSQL)
	}
	br := db.SendBatch(ctx, batch)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return pgconn.CommandTag{}, err
	}
	var tag pgconn.CommandTag
	if read == nil {
		var err error
		if tag, err = br.Exec(); err != nil {
			return tag, err
		}
	} else {
		rows, err := br.Query()
		if err != nil {
			return tag, err
		}
		err = read(rows)
		rows.Close()
		if err != nil {
			return tag, err
		}
		if err := rows.Err(); err != nil {
			return tag, err
		}
		tag = rows.CommandTag()
	}
	return tag, br.Close()
}

// indexedRow is QueryRow for a statement run as indexed runs it: its Scan
// runs the statement and scans its one row into dest, or returns
// pgx.ErrNoRows if there is none.
func indexedRow(ctx context.Context, db batcher, sql string, args ...any) pgx.Row {
	return indexedQueryRow{ctx: ctx, db: db, settings: seqscanOffSQL, sql: sql, args: args}
}

// indexedRowWith is indexedRow with settings, as indexedWith takes them.
func indexedRowWith(ctx context.Context, db batcher, settings, sql string, args ...any) pgx.Row {
	return indexedQueryRow{ctx: ctx, db: db, settings: settings, sql: sql, args: args}
}

type indexedQueryRow struct {
	ctx      context.Context
	db       batcher
	settings string
	sql      string
	args     []any
}

func (r indexedQueryRow) Scan(dest ...any) error {
	found := false
	_, err := indexedWith(r.ctx, r.db, r.settings, func(rows pgx.Rows) error {
		if !rows.Next() {
			return rows.Err()
		}
		found = true
		return rows.Scan(dest...)
	}, r.sql, r.args...)
	if err == nil && !found {
		return pgx.ErrNoRows
	}
	return err
}
