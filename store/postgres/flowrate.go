package postgres

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
)

// The rate limits' part of a claim under flow control: locking the keys it
// spends and reading their state, and holding back the tasks they do not
// admit.

// lock locks and reads the rate keys of cands not yet locked (waiting for
// the locks when wait is set, else only trying).
func (f *flowClaim) lock(ctx context.Context, cands []flowCandidate, wait bool) error {
	var refs []rateRef
	for _, c := range cands {
		if !c.live {
			continue
		}
		for _, u := range c.uses {
			r := rateRef{u.Limit, u.Key}
			if _, ok := f.rates[r]; !ok && !f.tried[r] && !slices.Contains(refs, r) {
				refs = append(refs, r)
			}
		}
	}
	return f.lockRates(ctx, refs, wait)
}

// rateLockSQL takes the transaction's advisory locks of the rate keys $1
// (limit and key joined by \x1f, sorted) in order, waiting, and returns
// those it holds: all of them.
const rateLockSQL = `SELECT k FROM unnest($1::text[]) WITH ORDINALITY AS u(k, n),
    pg_advisory_xact_lock(hashtextextended('stint.rate:' || k, 0)) ORDER BY n`

// rateTryLockSQL is rateLockSQL only trying: it returns the keys it holds.
const rateTryLockSQL = `SELECT k FROM unnest($1::text[]) WITH ORDINALITY AS u(k, n)
    WHERE pg_try_advisory_xact_lock(hashtextextended('stint.rate:' || k, 0)) ORDER BY n`

// rateLimitRowsSQL reads the limits $1 and key-share-locks their rows, so
// that a limit removed meanwhile is removed after this claim.
const rateLimitRowsSQL = `SELECT name, lim, period_us FROM stint_rate_limit WHERE name = ANY($1) ORDER BY name FOR KEY SHARE`

// rateKeysSQL reads the state of the rate keys ($1 limits, $2 keys) that
// have one.
const rateKeysSQL = `SELECT k.name, k.key, k.tat, k.frac, k.frac_lim, k.planned
FROM unnest($1::text[], $2::text[]) AS u(name, key)
JOIN stint_rate_key k ON k.name = u.name AND k.key = u.key`

// lockRates locks the rate keys refs in order (waiting for the locks when
// wait is set, else only trying) and reads their limits and state, in one
// round trip. A key of a limit that does not exist is locked and left
// out: its use is free.
func (f *flowClaim) lockRates(ctx context.Context, refs []rateRef, wait bool) error {
	b := &pgx.Batch{}
	q := f.queueRates(b, refs, wait)
	if q == nil {
		return nil
	}
	br := f.tx.SendBatch(ctx, b)
	defer br.Close()
	if err := f.readRates(br, q); err != nil {
		return err
	}
	return br.Close()
}

// rateRead is what queueRates queued, for readRates.
type rateRead struct {
	refs   []rateRef // sorted
	joined []string  // the refs as advisory lock names
	names  []string  // the limits read
}

// queueRates queues lockRates' statements in b; nil when refs is empty.
func (f *flowClaim) queueRates(b *pgx.Batch, refs []rateRef, wait bool) *rateRead {
	if len(refs) == 0 {
		return nil
	}
	q := &rateRead{refs: slices.Clone(refs)}
	for _, r := range refs {
		if _, ok := f.limits[r.limit]; !ok && !slices.Contains(q.names, r.limit) {
			q.names = append(q.names, r.limit)
		}
	}
	slices.Sort(q.names)
	slices.SortFunc(q.refs, func(a, b rateRef) int { return cmp.Or(cmp.Compare(a.limit, b.limit), cmp.Compare(a.key, b.key)) })
	q.joined = make([]string, len(q.refs))
	lims, keys := make([]string, len(q.refs)), make([]string, len(q.refs))
	for i, r := range q.refs {
		q.joined[i], lims[i], keys[i] = r.limit+"\x1f"+r.key, r.limit, r.key
	}
	if len(q.names) > 0 {
		b.Queue(rateLimitRowsSQL, q.names)
	}
	b.Queue(map[bool]string{true: rateLockSQL, false: rateTryLockSQL}[wait], q.joined)
	b.Queue(rateKeysSQL, lims, keys)
	return q
}

// readRates reads the results of queueRates' statements (nothing for nil).
func (f *flowClaim) readRates(br pgx.BatchResults, q *rateRead) error {
	if q == nil {
		return nil
	}
	if len(q.names) > 0 {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		var l api.RateLimit
		var us int64
		if _, err := pgx.ForEachRow(rows, []any{&l.Name, &l.Limit, &us}, func() error {
			l.Period = time.Duration(us) * time.Microsecond
			f.limits[l.Name] = l
			return nil
		}); err != nil {
			return err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	locked, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	held := map[rateRef]bool{}
	for i, r := range q.refs {
		f.readRefs[r] = true
		if _, ok := f.limits[r.limit]; !ok {
			continue
		}
		if !slices.Contains(locked, q.joined[i]) {
			if f.tried == nil {
				f.tried = map[rateRef]bool{}
			}
			f.tried[r] = true
			continue
		}
		held[r] = true
		l := f.limits[r.limit]
		f.rates[r] = newRateKey(r.limit, r.key, l.Limit, l.Period.Microseconds(), f.now, time.Time{}, 0, 1, nil)
	}
	rows, err = br.Query()
	if err != nil {
		return err
	}
	var name, key string
	var tat time.Time
	var frac, fracLim int64
	var planned *time.Time
	_, err = pgx.ForEachRow(rows, []any{&name, &key, &tat, &frac, &fracLim, &planned}, func() error {
		r := rateRef{name, key}
		if held[r] {
			l := f.limits[name]
			f.rates[r] = newRateKey(name, key, l.Limit, l.Period.Microseconds(), f.now, tat, frac, fracLim, planned)
		}
		return nil
	})
	return err
}

// rateAdmits reports whether every rate limit c uses admits it now. A
// task held back is planned on the keys that hold it, and moved to when
// the last of them admits it; a task with a key another claimer holds
// stays due.
func (f *flowClaim) rateAdmits(c flowCandidate, window int) bool {
	held := false
	for _, u := range c.uses {
		r := rateRef{u.Limit, u.Key}
		if _, ok := f.limits[u.Limit]; !ok {
			continue // the limit is gone: the use is free
		}
		k := f.rates[r]
		if k == nil {
			return false
		}
		held = held || !k.admits(u.Units)
	}
	if !held {
		return true
	}
	if len(f.moves) >= window {
		return false
	}
	m := flowMove{hint: c.hint, id: c.id}
	for _, u := range c.uses {
		k := f.rates[rateRef{u.Limit, u.Key}]
		if k == nil || k.admits(u.Units) {
			continue
		}
		if d := k.hold(u.Units); d > m.after {
			m.after = d
			m.wait = api.Wait{Reason: api.WaitRateLimit, Limit: u.Limit, Key: u.Key}
		}
	}
	f.moves = append(f.moves, m)
	f.taken[c.id] = true
	if f.wake == 0 || m.after < f.wake {
		f.wake = m.after
	}
	return false
}
