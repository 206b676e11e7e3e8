package postgres

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/faultpoint"
	"github.com/stinthq/stint/store"
)

// claimSQL takes up to $4 due tasks of the behaviors $2 in pickup order and
// issues each a lease: $3 for its behavior unless an operator set one in
// stint_behavior. It walks the claim index from each behavior's first hint
// (the index leads with the behavior, so hints of behaviors this node does
// not run are never walked past), locks up to $4 of each, keeps the first
// $4 of them all in pickup order (the others are let go at commit),
// deletes them, and claims each hint's task if the hint still matches it
// (a hint made stale by a later change is dropped where it is found). Paused
// behaviors and held group keys are skipped: their hints are parked, out of
// the claim index, but one added while the pause or hold committed may
// have stayed in it. $5 is the look-ahead
// (couch_jobs' max_sched_time): tasks due that soon are taken early. $6
// are the leases the node drew, if it did (see claimCTEs).
//
// claimSQL runs after its claim's turn (claimTurnSQL), so no other plain
// claim of its behaviors holds their hints, and it deletes the hints it
// walked without locking them first: the lock was a WAL record per task
// of its own. A hint another transaction holds (a hand-over's claim, a
// repark) is waited for, in ctid order (a Tid scan's), and skipped when
// it is gone or changed by then (its ctid no longer matches).
// claimSkipSQL, for a claim without the turn, passes over such hints.
var (
	claimSQL     = claimCTEs(walkHints(""), false, "")
	claimSkipSQL = claimCTEs(walkHints(skipLocked), false, "")
)

// skipLocked is the locking clause of walkHints for a claim that may run
// beside another of its behaviors.
const skipLocked = `
            FOR UPDATE SKIP LOCKED`

// walkHints returns the hints of claimSQL and flowTakeSQL, locked by lock
// as they are walked (see claimSQL).
func walkHints(lock string) string {
	return `
    DELETE FROM stint_due d WHERE d.ctid = ANY(ARRAY(
        SELECT f.ctid FROM cfg, LATERAL (
            SELECT c.ctid, c.priority, c.due FROM stint_due c
            WHERE NOT c.parked AND c.behavior = cfg.behavior AND c.due <= now() + $5 * interval '1 microsecond'
              AND (c.group_key IS NULL OR NOT EXISTS (SELECT 1 FROM stint_hold h WHERE h.group_key = c.group_key))
            ORDER BY c.priority, c.due
            LIMIT $4` + lock + `) f
        ORDER BY f.priority, f.due
        LIMIT $4))
    RETURNING d.id, d.priority, d.due`
}

// claimHintsSQL claims the tasks of the hints $4 (their ctids), already
// locked by the caller's transaction ($5 is unused, to keep the parameters
// of claimSQL; $6 the leases, as in claimSQL).
var claimHintsSQL = claimCTEs(`
    DELETE FROM stint_due d WHERE d.ctid = ANY($4::tid[]) AND $5::bigint IS NOT NULL
    RETURNING d.id, d.priority, d.due`, true, "")

// claimCTEs returns a claim statement that takes the hints deleted by
// hints (a DELETE FROM stint_due returning id, priority and due). cfg holds
// the settings of the behaviors $2 (lease $3 unless an operator set one;
// paused ones left out, and, unless the claim counted what it claims
// (counted: a claim under flow control), those capped at runtime: see
// uncapped) and a lease token for each, new: the node's ($6, one per
// behavior of $2; see store.ClaimRequest.Leases) or else drawn here. All tasks of a
// behavior that one statement claims share a lease row in stint_lease, the
// fencing token of each run. A running task keeps the due time it was
// claimed at in schedule_not_before, for a takeover to put it back in its
// place. The claim updates only columns no index of stint_task covers, so it
// is a HOT update. It clears the count of a wait on tasks (tasks_pending,
// see waitTasksSQL), which only the run that registers one sets. It records the running state in the change feed and
// returns the claimed tasks. Its lease rows go in in lease order, as
// ReleaseClaim's do, so that the two never wait on each other in a cycle.
//
// Each hint's task is found by a probe of the primary key (see
// seqscanOffSQL), whatever the statistics say: with t.id = h.id, a plan made
// on tables empty or analyzed while empty joined the hints to a
// sequential scan of stint_task, one scan of the table per hint (a second
// per claim of 1,000 at 4,000 tasks). The claimed tasks are returned in
// pickup order.
//
// A claim starts its tasks, and their lease runs, from flowNow: for a
// claim under flow control, the clock it read once it had its behavior's
// turn; for any other, the start of its transaction. A claim under flow
// control waits for its turn as long as another claimer holds it (a
// stopped node, say), and a lease counted from before that wait could be
// over when the claim commits, its tasks taken over while they start and
// their slots of a cap free for other claims.
//
// A counted claim also returns each task's rate uses and whether it waited
// on a rate limit. Its rows come in pickup order with the id last, and a
// row's uses only when they differ from the row before's (NULL otherwise;
// JSON null for none): most tasks of a claim use the same limits, and
// sending each task's was a tenth of the statement. guard, when not empty,
// is a further condition on each behavior (w.behavior) to be claimed at all.
func claimCTEs(hints string, counted bool, guard string) string {
	plain, returned, extra, order := "", "", "", ` ORDER BY priority, due`
	if !counted {
		plain = ` AND ` + uncapped("w.behavior")
	} else {
		returned = `, t.rate_uses, t.waiting IS NOT NULL AS waiting`
		extra = `, CASE WHEN rate_uses IS NOT DISTINCT FROM lag(rate_uses) OVER w THEN NULL ELSE coalesce(rate_uses, 'null') END, waiting`
		order = ` WINDOW w AS (ORDER BY priority, due, id) ORDER BY priority, due, id`
	}
	return `
WITH cfg AS MATERIALIZED (
    SELECT w.behavior, coalesce(b.lease_ms * 1000, w.lease_us) AS lease_us, coalesce(w.lease, gen_random_uuid()) AS lease, ` + flowNow + ` AS at
    FROM unnest($2::text[], $3::bigint[], $6::uuid[]) AS w(behavior, lease_us, lease)
    LEFT JOIN stint_behavior b ON b.behavior = w.behavior
    WHERE b.paused IS NOT TRUE` + plain + guard + `
), hint AS (` + hints + `
), claimed AS (
    UPDATE stint_task t SET
        status = 'running',
        lease = cfg.lease,
        node = $1,
        attempt = t.attempt + 1,
        executed_at = cfg.at,
        lost_not_before = cfg.at + cfg.lease_us * interval '1 microsecond',
        waiting_children = false,
        tasks_pending = NULL,
        resubmitted = t.resubmit,
        resubmit = false,
        updated_at = now()
    FROM hint h, cfg
    WHERE ` + hintProbe("t", "h") + ` AND t.behavior = cfg.behavior
    RETURNING t.id, t.lease, t.behavior, t.params, t.progress, t.attempt, t.errors, t.priority,
        t.parent_id, t.group_key, t.trace, cfg.lease_us, cfg.at, t.resubmitted, t.schedule_not_before AS due, t.version` + returned + `
), leases AS (
    INSERT INTO stint_lease (lease, node, expires_at, task_ids, task_count, behavior)
    SELECT lease, $1, max(at) + max(lease_us) * interval '1 microsecond', array_agg(id), count(*), min(behavior) FROM claimed GROUP BY lease
    ORDER BY lease
), feed AS (` + feedInsert("claimed", "'running'::text", "false") + `)
SELECT id, lease, behavior, params, progress, attempt, errors, priority,
    coalesce(parent_id, ''), coalesce(group_key, ''), coalesce(trace, ''), lease_us, resubmitted, coalesce(version, 0)` + extra + `
FROM claimed` + order
}

// behaviorLeases returns the behaviors of bs and their leases in
// microseconds, in order, as statement parameters.
func behaviorLeases(bs []store.BehaviorLease) ([]string, []int64) {
	behaviors := make([]string, len(bs))
	leases := make([]int64, len(bs))
	for i, b := range bs {
		behaviors[i], leases[i] = string(b.Behavior), b.Lease.Microseconds()
	}
	return behaviors, leases
}

// checkLeases refuses a claim whose node drew leases (see
// store.ClaimRequest.Leases) for other than each of its behaviors.
func checkLeases(req store.ClaimRequest) error {
	if len(req.Leases) != 0 && len(req.Leases) != len(req.Behaviors) {
		return fmt.Errorf("claim tasks: %d leases for %d behaviors: %w", len(req.Leases), len(req.Behaviors), api.ErrInvalid)
	}
	return nil
}

// claimLeases returns the leases the node drew for a claim of req as a
// statement parameter, NULL when it drew none.
func claimLeases(req store.ClaimRequest) uuidArray {
	if len(req.Leases) == 0 {
		return nil
	}
	out := make(uuidArray, len(req.Leases))
	for i, l := range req.Leases {
		out[i] = uuid(l)
	}
	return out
}

// dropHintsSQL deletes the claim hints $1 (their ctids).
const dropHintsSQL = `DELETE FROM stint_due WHERE ctid = ANY($1)`

// Claim takes due tasks; see store.Store.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) ([]store.Claimed, error) {
	behaviors, leases := behaviorLeases(req.Behaviors)
	if req.Limited() {
		out, _, err := s.ClaimFlow(ctx, req)
		return out, err
	}
	if err := checkLeases(req); err != nil {
		return nil, err
	}
	// One round trip, one implicit transaction: the claim commits without
	// waiting for its WAL flush, and walks the claim index (see
	// claimSettingsSQL) once the claims of its behaviors in flight
	// committed (see claimTurnSQL).
	batch := &pgx.Batch{}
	batch.Queue(claimSettingsSQL)
	batch.Queue(claimTurnSQL, behaviors)
	batch.Queue(claimSQL, req.Node, behaviors, leases, req.Limit, req.LookAhead.Microseconds(), claimLeases(req))
	br := s.pool.SendBatch(ctx, batch)
	defer br.Close()
	faultpoint.Reach(faultpoint.PlainClaim)
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("claim tasks: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("claim tasks: wait for the claim's turn: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("claim tasks: %w", err)
	}
	out, err := s.scanClaimed(rows, req.Limit, behaviors, nil)
	if err != nil {
		return nil, err
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("claim tasks: %w", err)
	}
	return out, nil
}

// claimTurnSQL waits for the claims of the behaviors $1 in flight on other
// connections to commit (the claim's whole transaction is one round trip,
// so a node stopped after sending it holds no turn: the server runs it to
// its commit): a transaction-scoped advisory lock per behavior,
// taken in name order so that claims of overlapping behaviors never wait
// on each other in a cycle. Claims that run side by side walk the same
// first hints of the claim index, and each steps past the hints the others
// hold locked (SKIP LOCKED reads every one's heap tuple): with four nodes
// claiming one backlog, half again as many pages per claimed task as with
// one. One claim at a time finds the hints before it deleted and committed.
// It runs as its own statement, so the claim's snapshot is taken after the
// wait.
const claimTurnSQL = `SELECT count(pg_advisory_xact_lock(hashtextextended('stint.claim:' || b, 0)))
FROM (SELECT b FROM unnest($1::text[]) AS b ORDER BY b) s`

// claimSettingsSQL sets what a claim needs for the transaction it runs in.
//
// synchronous_commit off lets the claim commit without waiting for its
// WAL to reach disk, which takes a disk flush off the way from a task's
// submit to its start. A claim may do without: should the database crash
// before the WAL writer flushed the claim (within a few hundred
// milliseconds), the claim is undone, so its tasks are due again and run
// once more, as when a node dies after claiming; the first run's writes
// find no lease and are fenced out. A commit that waits for its flush (a
// finish, a submit) flushes all WAL before its own, so nothing durable can
// depend on a claim that is lost.
//
// enable_seqscan off, as for every hot statement (see seqscanOffSQL): a
// plan made on tables empty or analyzed while empty reads the claim hints
// and tasks by sequential scans otherwise. The claim gives each table it
// reads an index condition (the behavior, the hints' ctids, the tasks'
// ids), so this setting leaves only those paths.
//
// enable_sort and enable_bitmapscan off leave the planner one way to find
// a behavior's first hints in pickup order: walking the claim index, which
// stops after the first few hundred (the merge of the behaviors' hints
// still sorts those few). The planner otherwise picks it by its
// estimate of how many hints are due, and on a table whose statistics
// are missing or old (a queue filled faster than autovacuum analyzes it)
// or in a generic plan (which cannot know now plus the look-ahead) it
// guesses few, and reads and sorts every due hint instead: 90,000 in a
// burn-down, 75 ms per claim instead of under 1, spilled to disk.
//
// jit off: a claim is short, and a misestimated cost must not buy it tens
// of milliseconds of compilation.
//
// plan_cache_mode force_generic_plan: the claim statement is planned once
// per connection, not per claim. PostgreSQL otherwise plans a prepared
// statement anew each time its plan for the parameters looks cheaper than
// the generic one, as a claim's always does when few tasks are due: each
// claim then cost about 0.5 ms of planning against 0.3 ms of execution,
// on the way from a submit to the start of its task. With the settings
// above, the generic plan walks the claim index as a custom one does.
const claimSettingsSQL = `SELECT set_config('synchronous_commit', 'off', true),
    set_config('enable_seqscan', 'off', true),
    set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true),
    set_config('jit', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)`

// scanClaimed reads the rows of a claim statement of behaviors, at most
// limit. The result is sized for as many as the last claim found (at least
// a few): a claim for a thousand free slots often finds a few tasks, but
// under load it finds as many as the last one, and growing the result to a
// thousand showed in profiles. uses, when not nil, receives the rate uses
// of a counted claim's tasks (see claimCTEs), one per task.
func (s *Store) scanClaimed(rows pgx.Rows, limit int, behaviors []string, uses *[]taskUses) ([]store.Claimed, error) {
	out := make([]store.Claimed, 0, min(limit, max(64, int(s.lastClaimed.Load()))))
	if uses != nil && *uses == nil {
		*uses = make([]taskUses, 0, cap(out))
	}
	var ids stringChunks
	var c store.Claimed
	var u taskUses
	var dec usesDecoder
	var err error
	fields := rows.FieldDescriptions()
	counted := len(fields) == len(claimedColumns)+2
	if counted {
		fields = fields[:len(claimedColumns)]
	}
	if claimedInBinary(fields) {
		binaryJSON := [2]bool{fields[3].Format == pgtype.BinaryFormatCode, fields[4].Format == pgtype.BinaryFormatCode}
		for err == nil && rows.Next() {
			v := rows.RawValues()
			if counted {
				u, err = dec.decode(v[len(claimedColumns):], rows.FieldDescriptions()[len(claimedColumns):])
				v = v[:len(claimedColumns)]
			}
			if err == nil {
				err = decodeClaimed(v, binaryJSON, &c, &ids, behaviors)
			}
			if err == nil {
				out = append(out, c)
				if uses != nil {
					*uses = append(*uses, u)
				}
			}
		}
		rows.Close()
		err = cmp.Or(err, rows.Err())
	} else {
		var id, behavior, params, progress, rateUses pgtype.DriverBytes
		var leaseUS int64
		dest := []any{&id, &c.Lease, &behavior, &params, &progress, &c.Attempt, &c.Errors,
			&c.Priority, &c.ParentID, &c.GroupKey, &c.Trace, &leaseUS, &c.Resubmitted, &c.Version}
		if counted {
			dest = append(dest, &rateUses, &u.waiting)
		}
		_, err = pgx.ForEachRow(rows, dest, func() error {
			c.ID = api.TaskID(ids.string(id))
			c.LeaseDuration = time.Duration(leaseUS) * time.Microsecond
			c.Behavior = internBehavior(behavior, behaviors)
			c.Params, c.Progress = copyJSON(params), copyJSON(progress)
			out = append(out, c)
			if uses != nil {
				var err error
				if u.uses, err = dec.uses(rateUses); err != nil {
					return err
				}
				*uses = append(*uses, u)
			}
			return nil
		})
	}
	if err != nil {
		return nil, fmt.Errorf("read claimed tasks: %w", err)
	}
	s.lastClaimed.Store(int64(len(out)))
	return out, nil
}

// claimedColumns are the types of the columns a claim statement returns.
var claimedColumns = [...]uint32{pgtype.TextOID, pgtype.UUIDOID, pgtype.TextOID, pgtype.JSONBOID, pgtype.JSONBOID,
	pgtype.Int4OID, pgtype.Int4OID, pgtype.Int2OID, pgtype.TextOID, pgtype.TextOID, pgtype.TextOID,
	pgtype.Int8OID, pgtype.BoolOID, pgtype.Int4OID}

// claimedInBinary reports whether the rows of a claim statement come as
// claimedColumns, the numbers, the UUID and the bool in the binary format
// (text is the same in both, and jsonb either), which decodeClaimed reads;
// other rows (those of the simple protocol, all in text) go through pgx's
// scanning, whose plan per value and column showed in CPU profiles.
func claimedInBinary(fields []pgconn.FieldDescription) bool {
	if len(fields) != len(claimedColumns) {
		return false
	}
	for i, f := range fields {
		if f.DataTypeOID != claimedColumns[i] {
			return false
		}
		switch f.DataTypeOID {
		case pgtype.TextOID, pgtype.JSONBOID:
		default:
			if f.Format != pgtype.BinaryFormatCode {
				return false
			}
		}
	}
	return true
}

// decodeClaimed decodes a row of claimedColumns (see claimedInBinary; the
// jsonb columns in binary where binaryJSON says so) into c. Values of the
// row's buffer that c keeps are copied.
func decodeClaimed(v [][]byte, binaryJSON [2]bool, c *store.Claimed, ids *stringChunks, behaviors []string) error {
	if len(v) != len(claimedColumns) || len(v[1]) != 16 || len(v[5]) != 4 || len(v[6]) != 4 ||
		len(v[7]) != 2 || len(v[11]) != 8 || len(v[12]) != 1 || len(v[13]) != 4 || v[0] == nil || v[2] == nil {
		return errors.New("a claimed row is not of the claim's columns")
	}
	params, err := jsonbText(v[3], binaryJSON[0])
	if err != nil {
		return err
	}
	progress, err := jsonbText(v[4], binaryJSON[1])
	if err != nil {
		return err
	}
	*c = store.Claimed{
		LeaseRef:      store.LeaseRef{ID: api.TaskID(ids.string(v[0])), Lease: [16]byte(v[1])},
		Behavior:      internBehavior(v[2], behaviors),
		Params:        copyJSON(params),
		Progress:      copyJSON(progress),
		Attempt:       int(int32(binary.BigEndian.Uint32(v[5]))),
		Errors:        int(int32(binary.BigEndian.Uint32(v[6]))),
		Priority:      int(int16(binary.BigEndian.Uint16(v[7]))),
		ParentID:      api.TaskID(v[8]),
		GroupKey:      string(v[9]),
		Trace:         string(v[10]),
		LeaseDuration: time.Duration(int64(binary.BigEndian.Uint64(v[11]))) * time.Microsecond,
		Resubmitted:   v[12][0] != 0,
		Version:       int(int32(binary.BigEndian.Uint32(v[13]))),
	}
	return nil
}

// jsonbText returns the JSON text of a jsonb value, nil for NULL. The
// binary format is a version byte, 1, and the text.
func jsonbText(b []byte, binary bool) ([]byte, error) {
	if b == nil || !binary {
		return b, nil
	}
	if len(b) == 0 || b[0] != 1 {
		return nil, errors.New("a claimed row has jsonb of an unknown version")
	}
	return b[1:], nil
}
