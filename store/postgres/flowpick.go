package postgres

import (
	"context"
	"encoding/json"
	"fmt"
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
	capped, seen := f.capKeys, f.seen
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
