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

// advisoryLock takes the transaction's advisory locks of names (sorted)
// under prefix, waiting or only trying, and returns those it holds.
func advisoryLock(ctx context.Context, tx pgx.Tx, prefix string, names []string, wait bool) ([]string, error) {
	lock := `SELECT k FROM unnest($1::text[]) WITH ORDINALITY AS u(k, n)
		WHERE pg_try_advisory_xact_lock(hashtextextended($2 || k, 0)) ORDER BY n`
	if wait {
		lock = `SELECT k FROM unnest($1::text[]) WITH ORDINALITY AS u(k, n),
			pg_advisory_xact_lock(hashtextextended($2 || k, 0)) ORDER BY n`
	}
	rows, err := tx.Query(ctx, lock, names, prefix)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// lockRates locks the rate keys refs (of limits that exist) in order and
// reads their state. The limits' rows are share-locked, so that a limit
// removed meanwhile is removed after this claim.
func (f *flowClaim) lockRates(ctx context.Context, refs []rateRef, wait bool) error {
	if len(refs) == 0 {
		return nil
	}
	var names []string
	for _, r := range refs {
		if _, ok := f.limits[r.limit]; !ok && !slices.Contains(names, r.limit) {
			names = append(names, r.limit)
		}
	}
	if len(names) > 0 {
		slices.Sort(names)
		rows, err := f.tx.Query(ctx, `SELECT name, lim, period_us FROM stint_rate_limit
			WHERE name = ANY($1) ORDER BY name FOR KEY SHARE`, names)
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
	refs = slices.DeleteFunc(refs, func(r rateRef) bool { _, ok := f.limits[r.limit]; return !ok })
	if len(refs) == 0 {
		return nil
	}
	slices.SortFunc(refs, func(a, b rateRef) int { return cmp.Or(cmp.Compare(a.limit, b.limit), cmp.Compare(a.key, b.key)) })
	names = names[:0]
	for _, r := range refs {
		names = append(names, r.limit+"\x1f"+r.key)
	}
	locked, err := advisoryLock(ctx, f.tx, "stint.rate:", names, wait)
	if err != nil {
		return err
	}
	var lims, keys []string
	for i, r := range refs {
		if !slices.Contains(locked, names[i]) {
			if f.tried == nil {
				f.tried = map[rateRef]bool{}
			}
			f.tried[r] = true
			continue
		}
		l := f.limits[r.limit]
		f.rates[r] = newRateKey(r.limit, r.key, l.Limit, l.Period.Microseconds(), f.now, time.Time{}, 0, 1, nil)
		lims, keys = append(lims, r.limit), append(keys, r.key)
	}
	if len(lims) == 0 {
		return nil
	}
	rows, err := f.tx.Query(ctx, `SELECT k.name, k.key, k.tat, k.frac, k.frac_lim, k.planned
		FROM unnest($1::text[], $2::text[]) AS u(name, key)
		JOIN stint_rate_key k ON k.name = u.name AND k.key = u.key`, lims, keys)
	if err != nil {
		return err
	}
	var name, key string
	var tat time.Time
	var frac, fracLim int64
	var planned *time.Time
	_, err = pgx.ForEachRow(rows, []any{&name, &key, &tat, &frac, &fracLim, &planned}, func() error {
		l := f.limits[name]
		f.rates[rateRef{name, key}] = newRateKey(name, key, l.Limit, l.Period.Microseconds(), f.now, tat, frac, fracLim, planned)
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
