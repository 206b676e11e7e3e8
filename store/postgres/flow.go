package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// A claim under flow control (store.ClaimRequest.Limited) takes one
// transaction of a few statements, where a plain claim is one statement:
// it reads the caps in force, locks what it counts, picks hints and
// claims them. Only behaviors with caps, fair share or rate-limited tasks
// take it.
//
// The claims of a behavior under flow control take turns across the
// cluster: each first takes the behavior's advisory lock, then reads the
// caps in force (so a cap stored before the lock was granted binds it) and
// counts the running tasks from the truth, the tasks running under a
// stored lease (runningSQL), after the previous claim committed. The plain
// claims and local starts of a behavior without caps of its own hold the
// same lock in shared mode while they run (see uncapped), so a claim that
// counts waits for them too. Rate limits, which behaviors may share, lock
// each key they spend (an advisory lock) and read its GCRA state
// (gcra.go). Locks are taken in one order (the behavior, then rate keys in
// order), waiting only in the first window of hints; later windows only
// try, and a rate key another claimer holds holds its tasks back for this
// claim, so that claimers never wait on each other in a cycle.
//
// A task a rate limit holds back is moved, with its hint, to the time the
// limit admits it after the ones held back before it (no attempt counted),
// and its waiting column says so. A task a cap holds back stays due.

// flowSettingsSQL adds to claimSettingsSQL what the flow claim's joins
// need: nested loops over primary keys, whatever the statistics. Unlike a
// plain claim, a claim under flow control commits only once its WAL is
// flushed: were it lost in a crash, its runs would have started (their
// side effects with them) while the budget and the slots they took went
// back to others.
const flowSettingsSQL = claimSettingsSQL + `, set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
    set_config('synchronous_commit', 'on', true)`

// flowLockSQL takes the behavior $1's turn (see ClaimFlow) when it has a
// hint due within the look-ahead $2, and returns a row then: a claim of a
// behavior with nothing due neither waits for nor delays the others.
const flowLockSQL = `SELECT pg_advisory_xact_lock(hashtextextended('stint.cap:' || $1, 0)) FROM (SELECT 1) one
WHERE EXISTS (SELECT 1 FROM stint_due d WHERE NOT d.parked AND d.behavior = $1
    AND d.due <= now() + $2 * interval '1 microsecond')`

// flowConfigSQL reads the database's now (the clock of every start and of
// the rate rule) and the behavior's caps set at runtime.
const flowConfigSQL = `SELECT now(), c.key, c.max, c.weight FROM (SELECT 1) one
LEFT JOIN stint_concurrency c ON c.behavior = $1`

// flowCandidates is the select list of the flow claim's candidate hints:
// the hint, its task, its group key and, when the hint still stands for
// its task, the task's rate uses and whether it waits on a rate limit
// (NULL when it does not stand). The task is read by primary key in a
// subquery, never a join, so that the plan stays one probe per hint
// whatever the statistics say.
var flowCandidates = `c.ctid, c.id, coalesce(c.group_key, ''),
    (SELECT jsonb_build_array(t.rate_uses, t.waiting IS NOT NULL) FROM stint_task t WHERE ` + hintMatches("t", "c") + `)`

// flowFilter keeps the hints a flow claim may take: of the behavior $1,
// due within the look-ahead $2, not parked or held, not of the group keys
// $4 (full), not among the hints $5 (seen).
const flowFilter = `NOT c.parked AND c.behavior = $1
  AND c.due <= now() + $2 * interval '1 microsecond'
  AND NOT EXISTS (SELECT 1 FROM stint_behavior b WHERE b.behavior = $1 AND b.paused)
  AND (c.group_key IS NULL OR (c.group_key <> ALL($4::text[])
       AND NOT EXISTS (SELECT 1 FROM stint_hold h WHERE h.group_key = c.group_key)))
  AND c.ctid <> ALL($5::tid[])`

// flowWindowSQL locks the first $3 hints in pickup order.
var flowWindowSQL = `
SELECT ` + flowCandidates + `
FROM stint_due c
WHERE ` + flowFilter + `
ORDER BY c.priority, c.due
LIMIT $3
FOR UPDATE SKIP LOCKED`

// flowKeysSQL locks the first $3 hints of each of up to $7 group keys
// after $6 in key order: a skip scan of stint_due_key finds the keys with
// hints, one index probe each, whatever their backlog.
var flowKeysSQL = `
WITH RECURSIVE k(key) AS (
    (SELECT d.group_key FROM stint_due d
     WHERE NOT d.parked AND d.group_key IS NOT NULL AND d.behavior = $1 AND d.group_key > $6
     ORDER BY d.group_key LIMIT 1)
  UNION ALL
    SELECT (SELECT d.group_key FROM stint_due d
            WHERE NOT d.parked AND d.group_key IS NOT NULL AND d.behavior = $1 AND d.group_key > k.key
            ORDER BY d.group_key LIMIT 1)
    FROM k WHERE k.key IS NOT NULL
)
SELECT x.* FROM (SELECT key FROM k WHERE key IS NOT NULL LIMIT $7) ks, LATERAL (
    SELECT ` + flowCandidates + `
    FROM stint_due c
    WHERE c.group_key IS NOT NULL AND c.group_key = ks.key AND ` + flowFilter + `
    ORDER BY c.priority, c.due
    LIMIT $3
    FOR UPDATE SKIP LOCKED) x`

// maxGroupRounds bounds the windows of hints one flow claim reads: each
// round leaves out the keys the ones before found at their cap.
const maxGroupRounds = 8

// fairKeys and fairPerKey bound what a fair-share claim reads: the first
// hints of up to fairKeys group keys, fairPerKey each, and as many in
// pickup order (for tasks without a key). A claim of a fair-share behavior
// takes at most fairPerKey tasks, so that claims come often and a key's
// first task waits for one claim, not for a claim of a thousand.
const (
	fairKeys   = 32
	fairPerKey = 256
)

// Claim's flow path; see store.Limits.ClaimFlow.
func (s *Store) ClaimFlow(ctx context.Context, req store.ClaimRequest) ([]store.Claimed, store.FlowHeld, error) {
	if len(req.Behaviors) != 1 {
		return nil, store.FlowHeld{}, fmt.Errorf("claim tasks: a claim under flow control must name one behavior, not %d", len(req.Behaviors))
	}
	if s.flowLoose(req) {
		out, err := s.takeFlow(ctx, req)
		if !errors.Is(err, errFlowBinds) {
			return out, store.FlowHeld{}, err
		}
	}
	behaviors := []string{string(req.Behaviors[0].Behavior)}
	leases := []int64{req.Behaviors[0].Lease.Microseconds()}
	var out []store.Claimed
	var held store.FlowHeld
	tight := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		f := newFlowClaim(tx, req)
		defer func() { tight = len(f.moves) > 0 || len(f.tried) > 0 || len(f.capped) > 0 }()
		if err := f.configure(ctx); err != nil {
			return err
		}
		if f.limit <= 0 {
			return nil
		}
		if err := f.pick(ctx, s); err != nil {
			return err
		}
		if err := f.write(ctx); err != nil {
			return err
		}
		held = store.FlowHeld{Delayed: len(f.moves), Wake: f.wake}
		if len(f.hints) == 0 {
			return nil
		}
		rows, err := tx.Query(ctx, claimHintsSQL, req.Node, behaviors, leases, f.hints, int64(0))
		if err != nil {
			return err
		}
		if out, err = s.scanClaimed(rows, len(f.hints), behaviors, nil); err != nil {
			return err
		}
		return f.clearWaiting(ctx, out)
	})
	if err != nil {
		return nil, store.FlowHeld{}, fmt.Errorf("claim tasks: %w", err)
	}
	if tight {
		s.flowTight.Store(behaviors[0], time.Now())
	}
	return out, held, nil
}

// flowClaim is the state of a claim under flow control.
type flowClaim struct {
	tx       querier // the claim's transaction
	req      store.ClaimRequest
	behavior string
	now      time.Time
	limit    int   // tasks to claim at most: the request's, within the cluster cap
	idle     bool  // nothing was due: the claim did not take its turn
	bound    int64 // an upper bound on the running tasks; see leaseBoundSQL

	cluster  int            // the cap on the behavior's running tasks; 0: none
	keyMax   map[string]int // caps of keys set at runtime
	weight   map[string]int // fair-share weights of keys set at runtime
	running  map[string]int // running tasks of the counted keys, picks included
	capped   []string       // keys at their cap, or locked by another claimer
	seen     []pgtype.TID   // hints read so far
	hints    []pgtype.TID   // hints picked to claim
	stale    []pgtype.TID   // hints that no longer stand for their task
	taken    map[string]bool
	waiting  []api.TaskID // picked tasks that wait on a rate limit, to clear
	last     string       // the group key of the last pick (fair share)
	limits   map[string]api.RateLimit
	rates    map[rateRef]*rateKey
	readRefs map[rateRef]bool // rate keys locked or tried, and read
	tried    map[rateRef]bool // rate keys another claimer held
	moves    []flowMove
	wake     time.Duration // the earliest wait of a move
}

// newFlowClaim returns the state of a claim of req in tx.
func newFlowClaim(tx querier, req store.ClaimRequest) *flowClaim {
	return &flowClaim{tx: tx, req: req, behavior: string(req.Behaviors[0].Behavior), running: map[string]int{},
		keyMax: map[string]int{}, weight: map[string]int{}, taken: map[string]bool{},
		rates: map[rateRef]*rateKey{}, readRefs: map[rateRef]bool{}, limits: map[string]api.RateLimit{}}
}

// rateRef names a key of a rate limit.
type rateRef struct{ limit, key string }

// flowMove is a task a rate limit holds back, to move to after from now.
type flowMove struct {
	hint  pgtype.TID
	id    string
	after time.Duration
	wait  api.Wait
}

// flowCandidate is a hint a flow claim read.
type flowCandidate struct {
	hint    pgtype.TID
	id, key string
	live    bool
	uses    []store.RateUse
	waiting bool
}

// configure locks the behavior, reads the caps in force and, when there
// are caps, bounds the running tasks: the claim's limit is what the
// behavior's cap leaves (0 when nothing is due). The running tasks are
// counted exactly (see runningSQL) only when caps per key need their
// counts, or when the bound from the lease rows (see leaseBoundSQL) does
// not leave room under the cluster cap for the whole claim; one round trip
// does the rest.
func (f *flowClaim) configure(ctx context.Context) error {
	b := &pgx.Batch{}
	f.queueConfigure(b)
	br := f.tx.SendBatch(ctx, b)
	defer br.Close()
	if err := f.readConfigure(br); err != nil {
		return err
	}
	if err := br.Close(); err != nil {
		return err
	}
	if f.needsCount() {
		return f.count(ctx)
	}
	return nil
}

// queueConfigure queues configure's statements in b.
func (f *flowClaim) queueConfigure(b *pgx.Batch) {
	b.Queue(flowSettingsSQL)
	b.Queue(flowLockSQL, f.behavior, f.req.LookAhead.Microseconds())
	b.Queue(flowConfigSQL, f.behavior)
	b.Queue(leaseBoundSQL, f.behavior)
}

// readConfigure reads the results of queueConfigure's statements (after
// those of the statements queued before them, which return no rows).
func (f *flowClaim) readConfigure(br pgx.BatchResults) error {
	if _, err := br.Exec(); err != nil {
		return err
	}
	tag, err := br.Exec()
	if err != nil {
		return err
	}
	f.idle = tag.RowsAffected() == 0
	rows, err := br.Query()
	if err != nil {
		return err
	}
	var key *string
	var m, w *int
	f.cluster = f.req.Cluster
	if _, err := pgx.ForEachRow(rows, []any{&f.now, &key, &m, &w}, func() error {
		switch {
		case key == nil:
		case *key == "":
			f.cluster = *m
		default:
			if *m > 0 {
				f.keyMax[*key] = *m
			}
			f.weight[*key] = *w
		}
		return nil
	}); err != nil {
		return err
	}
	if err := br.QueryRow().Scan(&f.bound); err != nil {
		return err
	}
	f.limit = f.req.Limit
	if f.idle {
		f.limit = 0
	}
	return nil
}

// needsCount reports whether the claim must count the running tasks: caps
// per key need their counts, and the cluster cap needs the total unless
// the bound leaves room for the whole claim.
func (f *flowClaim) needsCount() bool {
	if f.idle {
		return false
	}
	perKey := f.req.PerGroup > 0 || len(f.keyMax) > 0
	return perKey || f.cluster > 0 && f.bound+int64(f.limit) > int64(f.cluster)
}

// count counts the running tasks, by key, and brings the limit within
// the cluster cap.
func (f *flowClaim) count(ctx context.Context) error {
	byKey, total, err := runningOf(ctx, f.tx, f.behavior, f.req.Returned)
	if err != nil {
		return err
	}
	f.running = byKey
	if f.cluster > 0 {
		f.limit = min(f.limit, f.cluster-total)
	}
	return nil
}

// keyCap returns the cap in force on a group key; 0: none.
func (f *flowClaim) keyCap(key string) int {
	if key == "" {
		return 0
	}
	if m, ok := f.keyMax[key]; ok {
		return m
	}
	return f.req.PerGroup
}

// pick reads windows of hints and picks those the caps and rate limits
// admit, up to the limit.
func (f *flowClaim) pick(ctx context.Context, s *Store) error {
	// A window of as many hints as tasks to claim (four times as many
	// where keys are capped, so that a key's backlog at its cap is passed
	// in one read); the hints of keys at their cap and of tasks held back
	// leave room for the next window.
	if f.req.FairShare {
		f.limit = min(f.limit, fairPerKey)
	}
	window := f.limit
	if !f.req.FairShare && (f.req.PerGroup > 0 || len(f.keyMax) > 0) {
		window = 4 * f.limit
	}
	for round := 0; round < maxGroupRounds && len(f.hints) < f.limit && len(f.moves) < window; round++ {
		cands, err := f.read(ctx, f.req.FairShare, window, s)
		if err != nil {
			return err
		}
		if err := f.lock(ctx, cands, round == 0); err != nil {
			return err
		}
		if f.req.FairShare {
			cands = f.fairOrder(cands)
		}
		f.choose(cands, window)
		if f.req.FairShare || len(cands) < window {
			break
		}
	}
	if f.req.FairShare && f.last != "" {
		s.fairCursor.Store(f.behavior, f.last)
	}
	return nil
}

// read reads the next window of hints in pickup order; with fair share,
// also the first hints of the group keys after the one served last (from
// the first key again when they are fewer than fairKeys).
func (f *flowClaim) read(ctx context.Context, fair bool, window int, s *Store) ([]flowCandidate, error) {
	capped, seen := f.capped, f.seen
	if capped == nil {
		capped = []string{}
	}
	if seen == nil {
		seen = []pgtype.TID{}
	}
	look := f.req.LookAhead.Microseconds()
	cands, err := f.scan(ctx, flowWindowSQL, f.behavior, look, window, capped, seen)
	if err != nil || !fair {
		return cands, err
	}
	cursor := ""
	if c, ok := s.fairCursor.Load(f.behavior); ok {
		cursor = c.(string)
	}
	if f.last == "" {
		f.last = cursor
	}
	per := min(fairPerKey, max(f.limit, 1))
	for pass := 0; pass < 2; pass++ {
		more, err := f.scan(ctx, flowKeysSQL, f.behavior, look, per, capped, seen, cursor, fairKeys)
		if err != nil {
			return nil, err
		}
		cands = append(cands, more...)
		if cursor == "" || len(more) >= fairKeys {
			break
		}
		cursor = ""
	}
	return cands, nil
}

// scan runs a candidate query and records the hints it read as seen.
func (f *flowClaim) scan(ctx context.Context, query string, args ...any) ([]flowCandidate, error) {
	rows, err := f.tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	var out []flowCandidate
	var c flowCandidate
	var task []byte
	if _, err := pgx.ForEachRow(rows, []any{&c.hint, &c.id, &c.key, &task}, func() error {
		c.uses, c.waiting, c.live = nil, false, task != nil
		if c.live {
			var v [2]json.RawMessage // [rate uses, waiting]
			err := json.Unmarshal(task, &v)
			if err == nil {
				err = json.Unmarshal(v[0], &c.uses)
			}
			if err == nil {
				err = json.Unmarshal(v[1], &c.waiting)
			}
			if err != nil {
				return fmt.Errorf("task %s: rate uses: %w", c.id, err)
			}
		}
		out = append(out, c)
		return nil
	}); err != nil {
		return nil, err
	}
	for _, c := range out {
		f.seen = append(f.seen, c.hint)
	}
	return out, nil
}

// fairOrder orders candidates (duplicates dropped) for a fair-share claim:
// the group keys in turn from the one after the key served last, each
// turn taking as many of a key's hints (in pickup order) as its weight.
func (f *flowClaim) fairOrder(cands []flowCandidate) []flowCandidate {
	byKey := map[string][]flowCandidate{}
	seen := map[pgtype.TID]bool{}
	var keys []string
	for _, c := range cands {
		if seen[c.hint] {
			continue
		}
		seen[c.hint] = true
		if _, ok := byKey[c.key]; !ok {
			keys = append(keys, c.key)
		}
		byKey[c.key] = append(byKey[c.key], c)
	}
	slices.Sort(keys)
	// Start after the key served last, so that keys take turns across
	// claims too.
	at, _ := slices.BinarySearch(keys, f.last+"\x00")
	keys = append(keys[at:], keys[:at]...)
	out := make([]flowCandidate, 0, len(seen))
	for len(out) < len(seen) {
		for _, k := range keys {
			w := max(f.weight[k], 1)
			n := min(w, len(byKey[k]))
			out = append(out, byKey[k][:n]...)
			byKey[k] = byKey[k][n:]
		}
	}
	return out
}

// choose picks among cands, in order, the tasks the caps and rate limits
// admit, up to the limit; a task a rate limit holds back is to be moved
// (at most window of them per claim).
func (f *flowClaim) choose(cands []flowCandidate, window int) {
	for _, c := range cands {
		if len(f.hints) == f.limit {
			return
		}
		if !c.live {
			if !slices.Contains(f.stale, c.hint) {
				f.stale = append(f.stale, c.hint)
			}
			continue
		}
		if f.taken[c.id] {
			continue
		}
		if cap := f.keyCap(c.key); cap > 0 {
			if f.running[c.key] >= cap {
				if !slices.Contains(f.capped, c.key) {
					f.capped = append(f.capped, c.key)
				}
				continue
			}
		}
		if !f.rateAdmits(c, window) {
			continue
		}
		for _, u := range c.uses {
			if k := f.rates[rateRef{u.Limit, u.Key}]; k != nil {
				k.spend(u.Units)
			}
		}
		f.running[c.key]++
		f.taken[c.id] = true
		f.hints = append(f.hints, c.hint)
		f.last = c.key
		if c.waiting {
			f.waiting = append(f.waiting, api.TaskID(c.id))
		}
	}
}

// write drops the stale hints, moves the tasks held back and stores the
// rate keys' state, in one round trip.
func (f *flowClaim) write(ctx context.Context) error {
	b := &pgx.Batch{}
	f.queueWrite(b)
	return sendAll(ctx, f.tx, b)
}

// queueWrite queues write's statements in b.
func (f *flowClaim) queueWrite(b *pgx.Batch) {
	if len(f.stale) > 0 {
		b.Queue(dropHintsSQL, f.stale)
	}
	if len(f.moves) > 0 {
		var hints []pgtype.TID
		var ids []string
		after := map[string]int64{}
		waits := map[string]api.Wait{}
		for _, m := range f.moves {
			until := f.now.Add(m.after)
			m.wait.Until = &until
			hints, ids = append(hints, m.hint), append(ids, m.id)
			after[m.id], waits[m.id] = m.after.Microseconds(), m.wait
		}
		a, _ := json.Marshal(after) // numbers and strings: cannot fail
		w, _ := json.Marshal(waits)
		b.Queue(flowMoveSQL, hints, ids, string(a), string(w))
	}
	var names, keys []string
	var tats, planned []*time.Time
	var fracs, fracLims []int64
	for _, k := range f.rates {
		if !k.changed {
			continue
		}
		tat, frac, p := k.state(f.now)
		names, keys, tats, fracs, fracLims, planned = append(names, k.name), append(keys, k.key), append(tats, &tat),
			append(fracs, frac), append(fracLims, k.lim), append(planned, p)
	}
	if len(names) > 0 {
		b.Queue(rateKeysWriteSQL, names, keys, tats, fracs, fracLims, planned)
	}
}

// rateKeysWriteSQL stores the state of rate keys.
const rateKeysWriteSQL = `INSERT INTO stint_rate_key (name, key, tat, frac, frac_lim, planned)
SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::bigint[], $5::bigint[], $6::timestamptz[])
ON CONFLICT (name, key) DO UPDATE SET tat = excluded.tat, frac = excluded.frac,
    frac_lim = excluded.frac_lim, planned = excluded.planned`

// sendAll runs the statements of b in one round trip.
func sendAll(ctx context.Context, db batcher, b *pgx.Batch) error {
	if b.Len() == 0 {
		return nil
	}
	br := db.SendBatch(ctx, b)
	for range b.Len() {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
	}
	return br.Close()
}

// flowMoveSQL moves the tasks of the hints $1 (ctids; the tasks' ids $2)
// that still stand for them to now plus their wait ($3: a JSON object of
// microseconds by task id), with their hints, and records what they wait
// on ($4: a JSON object of api.Wait by task id). The tasks are found by
// primary key and matched to their hints by a hashed lookup, and their
// values by a key of the JSON objects, so that the plan is one probe per
// task whatever the statistics say.
var flowMoveSQL = `
WITH t AS (
    UPDATE stint_task t SET schedule_not_before = now() + ($3::jsonb ->> t.id)::bigint * interval '1 microsecond',
        waiting = $4::jsonb -> t.id, updated_at = now()
    WHERE t.id = ANY($2::text[]) AND t.status IN ` + waitingStatuses + `
      AND ((t.id, t.schedule_not_before, t.priority) IN (SELECT c.id, c.due, c.priority FROM stint_due c WHERE c.ctid = ANY($1::tid[]))) IS TRUE
    RETURNING t.id
)
UPDATE stint_due d SET due = now() + ($3::jsonb ->> d.id)::bigint * interval '1 microsecond'
WHERE d.ctid = ANY($1::tid[]) AND (d.id IN (SELECT id FROM t)) IS TRUE`

// clearWaiting clears the waiting column of the claimed tasks that waited
// on a rate limit.
func (f *flowClaim) clearWaiting(ctx context.Context, claimed []store.Claimed) error {
	b := &pgx.Batch{}
	f.queueClearWaiting(b, claimed)
	return sendAll(ctx, f.tx, b)
}

// queueClearWaiting queues clearWaiting's statement in b, if it has one.
func (f *flowClaim) queueClearWaiting(b *pgx.Batch, claimed []store.Claimed) {
	if len(f.waiting) > 0 && len(claimed) > 0 {
		b.Queue(`UPDATE stint_task SET waiting = NULL WHERE id = ANY($1) AND waiting IS NOT NULL`, f.waiting)
	}
}
