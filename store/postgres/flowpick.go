package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// The careful claim's picking (see ClaimFlow): windows of candidate hints
// read in pickup order (or a few of each group key in turn, for fair
// share), and the tasks among them that the caps and rate limits admit.

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
  AND c.due <= ` + flowNow + ` + $2 * interval '1 microsecond'
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

// groupKeysCTE is k, the group keys of the behavior $1 with a hint due
// within the look-ahead $2, after $6 in key order: a skip scan of
// stint_due_key, one index probe per key (which passes the key's hints
// not due yet). A key with nothing due is not among them, so that it
// takes no place of the keys a claim reads.
var groupKeysCTE = `
WITH RECURSIVE k(key) AS (
    (SELECT d.group_key FROM stint_due d
     WHERE NOT d.parked AND d.group_key IS NOT NULL AND d.behavior = $1 AND d.group_key > $6
       AND d.due <= ` + flowNow + ` + $2 * interval '1 microsecond'
     ORDER BY d.group_key LIMIT 1)
  UNION ALL
    SELECT (SELECT d.group_key FROM stint_due d
            WHERE NOT d.parked AND d.group_key IS NOT NULL AND d.behavior = $1 AND d.group_key > k.key
              AND d.due <= ` + flowNow + ` + $2 * interval '1 microsecond'
            ORDER BY d.group_key LIMIT 1)
    FROM k WHERE k.key IS NOT NULL
)
`

// flowKeysSQL locks the first $3 hints of each of up to $7 group keys
// with a hint due, after $6 in key order (see groupKeysCTE).
var flowKeysSQL = groupKeysCTE + `SELECT x.* FROM (SELECT key FROM k WHERE key IS NOT NULL LIMIT $7) ks, LATERAL (
    SELECT ` + flowCandidates + `
    FROM stint_due c
    WHERE c.group_key IS NOT NULL AND c.group_key = ks.key AND ` + flowFilter + `
    ORDER BY c.priority, c.due
    LIMIT $3
    FOR UPDATE SKIP LOCKED) x`

// flowRoomSQL locks, for a behavior under a cap per group key, the hints
// the caps may admit: the first hints of each of up to $7 group keys
// after $6 in key order that are not at their cap ($4) nor held, as many as the
// key's room ($8, a JSON object of rooms by key; $3 for a key not in it),
// and the hints without a key among the first $9 in pickup order, all in
// pickup order. The keys are found by a skip scan of stint_due_key, one
// probe each, so that what a claim reads and locks is bounded by the
// keys' rooms, not by the backlog of the keys at their cap, which a
// window in pickup order walked through and locked, thousands of hints
// to admit a few.
var flowRoomSQL = groupKeysCTE + `SELECT x.ctid, x.id, x.key, x.task FROM (
    SELECT y.* FROM (SELECT key FROM k WHERE key IS NOT NULL AND key <> ALL($4::text[])
                       AND NOT EXISTS (SELECT 1 FROM stint_hold h WHERE h.group_key = k.key) LIMIT $7) ks, LATERAL (
        SELECT c.priority, c.due, ` + flowCandidates + ` AS task
        FROM stint_due c
        WHERE c.group_key IS NOT NULL AND c.group_key = ks.key AND ` + flowFilter + `
        ORDER BY c.priority, c.due
        LIMIT coalesce(($8::jsonb ->> ks.key)::int, $3)
        FOR UPDATE SKIP LOCKED) y
  UNION ALL
    SELECT n.* FROM unnest(ARRAY(SELECT f.ctid FROM (
            SELECT w.ctid, w.group_key FROM stint_due w
            WHERE NOT w.parked AND w.behavior = $1 AND w.due <= ` + flowNow + ` + $2 * interval '1 microsecond'
            ORDER BY w.priority, w.due LIMIT $9) f WHERE f.group_key IS NULL)) AS w(ctid), LATERAL (
        SELECT c.priority, c.due, ` + flowCandidates + ` AS task
        FROM stint_due c
        WHERE c.ctid = w.ctid AND c.group_key IS NULL AND ` + flowFilter + `
        FOR UPDATE SKIP LOCKED) n
) x(priority, due, ctid, id, key, task)
ORDER BY x.priority, x.due`

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

// flowCandidate is a hint a flow claim read.
type flowCandidate struct {
	hint    pgtype.TID
	id, key string
	live    bool
	uses    []store.RateUse
	waiting bool
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
	if !f.req.FairShare && f.req.PerGroup > 0 {
		return f.pickRoom(ctx, s)
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

// noKeyWindow bounds how far in pickup order a claim of a behavior with a
// cap per group key looks for tasks without a key, whatever the claim's
// limit (a claim of one task looks as far): such a task overtakes at most
// this many hints of keys at their cap. There is no index of the
// hints without a key (it would cost every plain task an index entry), so
// the look walks hints of any key.
const noKeyWindow = 256

// pickRoom is pick for a behavior with a cap per group key, without fair
// share: one read of the hints the keys' rooms admit (flowRoomSQL), the
// keys at their cap left out. When there are more keys with room than
// the claim may take tasks, it reads the first keys after the last one
// the behavior's claim read before, so that keys take turns; else from
// the first key.
func (f *flowClaim) pickRoom(ctx context.Context, s *Store) error {
	rooms := map[string]int{}
	full := []string{}
	for k, n := range f.running {
		if c := f.keyCap(k); c > 0 && n >= c {
			full = append(full, k)
		} else if c > 0 {
			rooms[k] = c - n
		}
	}
	for k, c := range f.keyMax {
		if _, ok := f.running[k]; !ok {
			rooms[k] = c
		}
	}
	// A key at its cap holds back its tasks: the claim reports the cap
	// full, so that the ends of its runs wake the claimers (the claim
	// found a hint due, or it would not have taken its turn).
	f.capKeys = full
	room, _ := json.Marshal(rooms) // ints by string: cannot fail
	cursor := ""
	if c, ok := s.roomCursor.Load(f.behavior); ok {
		cursor = c.(string)
	}
	look := f.req.LookAhead.Microseconds()
	maxKeys := max(f.limit, 1)
	var cands []flowCandidate
	for {
		read, err := f.scan(ctx, flowRoomSQL, f.behavior, look, f.req.PerGroup, full, f.seenOrEmpty(), cursor,
			maxKeys, string(room), noKeyWindow)
		if err != nil {
			return err
		}
		keys := map[string]bool{}
		for _, c := range read {
			if c.key != "" {
				keys[c.key] = true
			}
		}
		next := ""
		if len(keys) >= maxKeys {
			next = slices.Max(slices.Collect(maps.Keys(keys)))
		}
		s.roomCursor.Store(f.behavior, next)
		cands, f.allKeys = read, cursor == "" && len(keys) < maxKeys
		// The keys before the cursor are the next claim's, unless
		// those after it had nothing: then from the first key.
		if len(read) > 0 || cursor == "" {
			break
		}
		cursor = ""
	}
	if err := f.lock(ctx, cands, true); err != nil {
		return err
	}
	f.choose(cands, len(cands))
	return nil
}

// heldByCaps sets in h whether the claim, having taken claimed tasks, was
// held back by a cap across nodes (FlowHeld.Capped) and took all the caps
// admit (FlowHeld.Drained). A drained claim left a cap full, so it counts
// as held back too.
func (f *flowClaim) heldByCaps(h *store.FlowHeld, claimed int) {
	h.Drained = f.drained(claimed)
	h.Capped = f.capped() || h.Drained
}

// drained reports whether the claim, having taken claimed tasks, took
// every task its caps admit: no task due now is left that another claim
// could take before a slot of the behavior frees (or a task falls due, or
// a cap changes). Either it filled the cluster cap, or it read the room
// of every group key with a task due (pickRoom reads no more than a key's
// room), fell short of its limit, and left a key at its cap.
func (f *flowClaim) drained(claimed int) bool {
	switch {
	case len(f.tried) > 0 || len(f.stale) > 0:
		return false
	case f.full && claimed == f.limit:
		return true
	case !f.allKeys || claimed >= f.limit:
		return false
	}
	for k, n := range f.running {
		if c := f.keyCap(k); c > 0 && n >= c {
			return true
		}
	}
	return false
}

// read reads the next window of hints in pickup order; with fair share,
// also the first hints of the group keys after the one served last (from
// the first key again when they are fewer than fairKeys).
func (f *flowClaim) read(ctx context.Context, fair bool, window int, s *Store) ([]flowCandidate, error) {
	capped, seen := f.capKeys, f.seenOrEmpty()
	if capped == nil {
		capped = []string{}
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

// seenOrEmpty returns the hints read so far, never nil: a nil slice
// would be sent as NULL, and no hint is unequal to all of NULL.
func (f *flowClaim) seenOrEmpty() []pgtype.TID {
	if f.seen == nil {
		return []pgtype.TID{}
	}
	return f.seen
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
				if !slices.Contains(f.capKeys, c.key) {
					f.capKeys = append(f.capKeys, c.key)
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
