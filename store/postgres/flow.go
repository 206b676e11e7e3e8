package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/faultpoint"
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
// back to others. It holds its behavior's turn across round trips, so it
// bounds how long it may idle in between (see holdIdleSQL).
var flowSettingsSQL = claimSettingsSQL + `, set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
    set_config('synchronous_commit', 'on', true), ` + holdIdleSQL

// flowLockSQL takes the behavior $1's turn (see ClaimFlow) when it has a
// hint due within the look-ahead $2, and returns a row then: a claim of a
// behavior with nothing due neither waits for nor delays the others.
var flowLockSQL = `SELECT pg_advisory_xact_lock(hashtextextended('stint.cap:' || $1, 0)) FROM (SELECT 1) one
WHERE ` + hasDueHint("$1", "$2")

// flowTurnSQL is flowLockSQL for a behavior known to be busy: it takes the
// turn without looking for a hint due first (the look walks the claim
// index past the hints the claims before deleted, as the claim does
// again), and returns a row.
const flowTurnSQL = `SELECT pg_advisory_xact_lock(hashtextextended('stint.cap:' || $1, 0))`

// flowConfigSQL reads the database's clock, the start of the claim's
// transaction and the behavior's caps set at runtime. The clock is read
// once the behavior's turn is taken (the statement before it, in the same
// batch) and kept for the transaction (flowNow): it is the time of the
// claim's starts and of the rate rule. The transaction's start (now())
// would not do: a claim waits for its turn as long as another claimer
// holds it, and budget spent at a time from before that wait would let
// the next claim start a full burst right after this one's.
const flowConfigSQL = `SELECT s.at, now(), c.key, c.max, c.weight
FROM (SELECT set_config('stint.now', clock_timestamp()::text, true)::timestamptz AS at) s
LEFT JOIN stint_concurrency c ON c.behavior = $1`

// flowNow is the clock flowConfigSQL read, in the statements of a claim
// under flow control after it; now() in any other transaction.
const flowNow = `coalesce(nullif(current_setting('stint.now', true), '')::timestamptz, now())`

// Claim's flow path; see store.Limits.ClaimFlow.
func (s *Store) ClaimFlow(ctx context.Context, req store.ClaimRequest) ([]store.Claimed, store.FlowHeld, error) {
	if len(req.Behaviors) != 1 {
		return nil, store.FlowHeld{}, fmt.Errorf("claim tasks: a claim under flow control must name one behavior, not %d", len(req.Behaviors))
	}
	if err := checkLeases(req); err != nil {
		return nil, store.FlowHeld{}, err
	}
	if s.flowLoose(req) {
		out, held, err := s.takeFlow(ctx, req)
		if !errors.Is(err, errFlowBinds) {
			return out, held, err
		}
	}
	var f *flowClaim
	var out []store.Claimed
	var held store.FlowHeld
	err := s.connTx(ctx, func(c *pgx.Conn) (err error) {
		f = newFlowClaim(c, req)
		out, held, err = s.claimFlowOn(ctx, f)
		return err
	})
	if err != nil {
		return nil, store.FlowHeld{}, fmt.Errorf("claim tasks: %w", err)
	}
	if len(f.moves) > 0 || len(f.tried) > 0 || len(f.capKeys) > 0 {
		s.flowTight.Store(f.behavior, time.Now())
	}
	f.heldByCaps(&held, len(out))
	return out, held, nil
}

// claimFlowOn is ClaimFlow's careful claim on f's connection: it opens
// the transaction and, unless it fails, commits it. The transaction opens
// in the batch that takes the behavior's turn and reads the caps, and
// commits in the batch that claims, so that a claim takes three round
// trips (the turn, the pick, the claim) where no rate key or exact count
// needs its own. A claim nested in a transaction open already (a
// finish's hand-over: see finishHandOver) neither opens nor commits it.
func (s *Store) claimFlowOn(ctx context.Context, f *flowClaim) ([]store.Claimed, store.FlowHeld, error) {
	b := &pgx.Batch{}
	if !f.nested {
		b.Queue("BEGIN")
	}
	if err := f.configure(ctx, b); err != nil {
		return nil, store.FlowHeld{}, err
	}
	if !f.idle {
		faultpoint.Reach(faultpoint.FlowClaim)
	}
	if f.limit <= 0 {
		if f.nested {
			return nil, store.FlowHeld{}, nil
		}
		return nil, store.FlowHeld{}, commitConn(ctx, f.tx)
	}
	if err := f.pick(ctx, s); err != nil {
		return nil, store.FlowHeld{}, err
	}
	held := store.FlowHeld{Delayed: len(f.moves), Wake: f.wake, LeaseDelay: f.leaseDelay()}
	behaviors := []string{f.behavior}
	b = &pgx.Batch{}
	f.queueWrite(b)
	writes := b.Len()
	if len(f.hints) > 0 {
		b.Queue(claimHintsSQL, f.req.Node, behaviors, []int64{f.req.Behaviors[0].Lease.Microseconds()}, f.hints, int64(0), claimLeases(f.req))
	}
	// The claimed tasks that waited on a rate limit are known once the
	// claim returned: their waiting is cleared before the commit.
	clear := len(f.waiting) > 0 && len(f.hints) > 0
	commit := !clear && !f.nested
	if commit {
		b.Queue("COMMIT")
	}
	var out []store.Claimed
	err := func() error {
		br := f.tx.SendBatch(ctx, b)
		defer br.Close()
		for range writes {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if len(f.hints) > 0 {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			if out, err = s.scanClaimed(rows, len(f.hints), behaviors, nil); err != nil {
				return err
			}
		}
		if commit {
			if err := execCommit(br); err != nil {
				return err
			}
		}
		return br.Close()
	}()
	if err != nil {
		return nil, store.FlowHeld{}, err
	}
	if clear {
		b = &pgx.Batch{}
		f.queueClearWaiting(b, out)
		if !f.nested {
			b.Queue("COMMIT")
		}
		if err := sendAll(ctx, f.tx, b); err != nil {
			return nil, store.FlowHeld{}, err
		}
	}
	return out, held, nil
}

// leaseDelay is how long after the claim's transaction began its leases
// began, by the database's clock: how long it waited for its turn.
func (f *flowClaim) leaseDelay() time.Duration { return max(f.now.Sub(f.began), 0) }

// flowClaim is the state of a claim under flow control.
type flowClaim struct {
	tx       querier // the claim's transaction
	req      store.ClaimRequest
	behavior string
	now      time.Time // the claim's clock; see flowConfigSQL
	began    time.Time // the start of the claim's transaction
	limit    int       // tasks to claim at most: the request's, within the cluster cap
	idle     bool      // nothing was due: the claim did not take its turn
	nested   bool      // the claim runs in a transaction open already, which it leaves open
	bound    int64     // an upper bound on the running tasks; see leaseBoundSQL
	full     bool      // the cluster cap left less than the request's limit
	allKeys  bool      // the pick read the room of every group key with a task due

	cluster  int            // the cap on the behavior's running tasks; 0: none
	keyMax   map[string]int // caps of keys set at runtime
	weight   map[string]int // fair-share weights of keys set at runtime
	running  map[string]int // running tasks of the counted keys, picks included
	capKeys  []string       // keys at their cap, or locked by another claimer
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

// configure locks the behavior, reads the caps in force and, when there
// are caps, bounds the running tasks: the claim's limit is what the
// behavior's cap leaves (0 when nothing is due). The running tasks are
// counted exactly (see runningSQL) only when caps per key need their
// counts, or when the bound from the lease rows (see leaseBoundSQL) does
// not leave room under the cluster cap for the whole claim; one round trip
// does the rest.
func (f *flowClaim) configure(ctx context.Context, b *pgx.Batch) error {
	before := b.Len()
	f.queueConfigure(b, true)
	// A cap per group key needs the running counts whatever the caps set
	// at runtime say: they are counted in the same round trip.
	early := f.req.PerGroup > 0
	if early {
		ids, leases := leaseRefArrays(f.req.Returned)
		b.Queue(runningSQL, f.behavior, ids, leases)
	}
	br := f.tx.SendBatch(ctx, b)
	defer br.Close()
	for range before {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	if err := f.readConfigure(br); err != nil {
		return err
	}
	if early {
		byKey, total, err := readRunning(br.Query())
		if err != nil {
			return err
		}
		f.counted(byKey, total)
	}
	if err := br.Close(); err != nil {
		return err
	}
	if !early && f.needsCount() {
		return f.count(ctx)
	}
	return nil
}

// queueConfigure queues configure's statements in b; look takes the turn
// only if a hint is due (flowLockSQL), else at once (flowTurnSQL).
func (f *flowClaim) queueConfigure(b *pgx.Batch, look bool) {
	b.Queue(flowSettingsSQL)
	if look {
		b.Queue(flowLockSQL, f.behavior, f.req.LookAhead.Microseconds())
	} else {
		b.Queue(flowTurnSQL, f.behavior)
	}
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
	if _, err := pgx.ForEachRow(rows, []any{&f.now, &f.began, &key, &m, &w}, func() error {
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
	f.counted(byKey, total)
	return nil
}

// counted records the running tasks by key and brings the limit within
// the cluster cap.
func (f *flowClaim) counted(byKey map[string]int, total int) {
	f.running = byKey
	if f.cluster > 0 && f.cluster-total < f.limit {
		f.limit, f.full = f.cluster-total, true
	}
}

// capped reports whether a cap across nodes held tasks back: the cluster
// cap left less than asked, or a group key was at its cap.
func (f *flowClaim) capped() bool { return f.full || len(f.capKeys) > 0 }

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

// queueWrite queues in b the statements that drop the stale hints, move
// the tasks held back and store the rate keys' state.
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
// that still stand for them to the claim's clock (flowNow) plus their wait ($3: a JSON object of
// microseconds by task id), with their hints, and records what they wait
// on ($4: a JSON object of api.Wait by task id). The tasks are found by
// primary key and matched to their hints by a hashed lookup, and their
// values by a key of the JSON objects, so that the plan is one probe per
// task whatever the statistics say.
var flowMoveSQL = `
WITH t AS (
    UPDATE stint_task t SET schedule_not_before = ` + flowNow + ` + ($3::jsonb ->> t.id)::bigint * interval '1 microsecond',
        waiting = $4::jsonb -> t.id, updated_at = now()
    WHERE t.id = ANY($2::text[]) AND t.status IN ` + waitingStatuses + `
      AND ((t.id, t.schedule_not_before, t.priority) IN (SELECT c.id, c.due, c.priority FROM stint_due c WHERE c.ctid = ANY($1::tid[]))) IS TRUE
    RETURNING t.id
)
UPDATE stint_due d SET due = ` + flowNow + ` + ($3::jsonb ->> d.id)::bigint * interval '1 microsecond'
WHERE d.ctid = ANY($1::tid[]) AND (d.id IN (SELECT id FROM t)) IS TRUE`

// queueClearWaiting queues in b, if it has one, the statement that clears
// the waiting column of the claimed tasks that waited on a rate limit.
func (f *flowClaim) queueClearWaiting(b *pgx.Batch, claimed []store.Claimed) {
	if len(f.waiting) > 0 && len(claimed) > 0 {
		b.Queue(`UPDATE stint_task SET waiting = NULL WHERE id = ANY($1) AND waiting IS NOT NULL`, f.waiting)
	}
}
