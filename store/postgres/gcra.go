package postgres

import (
	"math/big"
	"time"
)

// The rate rule is a token bucket in its GCRA form (api.RateLimit): a key
// of a limit of lim units per period has a theoretical arrival time, tat,
// the time its budget is full again. A start of u units at now is allowed
// when max(tat, now) + u*period/lim - now <= period, and moves tat there.
// Whatever order the claims of several nodes take, over any window of
// length w a key starts at most lim + lim*w/period units: the starts in the
// window move tat by their units, from no earlier than the window's start
// to no later than its end plus period.
//
// The arithmetic is exact: times are kept relative to the claim's now and
// scaled by lim, so that a unit (period/lim) is period_us whole steps and
// nothing rounds. big.Int keeps lim*period from overflowing.

// rateKey is one key of a rate limit during a claim.
type rateKey struct {
	name, key     string
	lim, periodUS int64
	// spent is (tat - now) * lim in microseconds, at least 0: the budget
	// spent, scaled.
	spent *big.Int
	// planned is the same for the time the tasks held back so far will
	// have spent the budget: a task held back is moved after them.
	planned *big.Int
	// denied is set once a task of the key was held back in this claim:
	// the key's later tasks wait behind it.
	denied bool
	// changed is set when the state is to be stored.
	changed bool
}

// newRateKey returns the state of a key from its stored row (tat zero for
// none) at now. frac is in 1/fracLim microseconds; stored under another
// lim, it rounds up to a whole microsecond.
func newRateKey(name, key string, lim, periodUS int64, now, tat time.Time, frac, fracLim int64, planned *time.Time) *rateKey {
	k := &rateKey{name: name, key: key, lim: lim, periodUS: periodUS, spent: new(big.Int), planned: new(big.Int)}
	if !tat.IsZero() {
		k.spent = scaledSince(now, tat, lim)
		switch {
		case fracLim == lim:
			k.spent.Add(k.spent, big.NewInt(frac))
		case frac > 0:
			k.spent.Add(k.spent, big.NewInt(lim))
		}
		if k.spent.Sign() < 0 {
			k.spent.SetInt64(0)
		}
	}
	if planned != nil {
		k.planned = scaledSince(now, *planned, lim)
		if k.planned.Sign() < 0 {
			k.planned.SetInt64(0)
		}
	}
	return k
}

// scaledSince returns (t - now) * lim in microseconds.
func scaledSince(now, t time.Time, lim int64) *big.Int {
	d := big.NewInt(t.UnixMicro() - now.UnixMicro())
	return d.Mul(d, big.NewInt(lim))
}

// cost returns units scaled: units * period_us.
func (k *rateKey) cost(units int64) *big.Int {
	return new(big.Int).Mul(big.NewInt(units), big.NewInt(k.periodUS))
}

// bucket returns lim * period_us, the whole budget scaled.
func (k *rateKey) bucket() *big.Int {
	return new(big.Int).Mul(big.NewInt(k.lim), big.NewInt(k.periodUS))
}

// admits reports whether units may start now.
func (k *rateKey) admits(units int64) bool {
	if k.denied {
		return false
	}
	sum := new(big.Int).Add(k.spent, k.cost(units))
	return sum.Cmp(k.bucket()) <= 0
}

// spend records a start of units now; admits must have said yes.
func (k *rateKey) spend(units int64) {
	k.spent.Add(k.spent, k.cost(units))
	if k.planned.Cmp(k.spent) < 0 {
		k.planned.Set(k.spent)
	}
	k.changed = true
}

// hold returns how long from now a task of units that this key holds back
// is to wait: until the key admits it after the tasks held back before it.
// It plans the task's units at that time, so the next one waits after it.
func (k *rateKey) hold(units int64) time.Duration {
	base := k.spent
	if k.planned.Cmp(base) > 0 {
		base = k.planned
	}
	// The earliest t (scaled by lim) with base - t + cost <= bucket.
	need := new(big.Int).Add(base, k.cost(units))
	need.Sub(need, k.bucket())
	t := ceilDivBig(need, k.lim) // microseconds
	if t < 1 {
		t = 1
	}
	at := new(big.Int).Mul(big.NewInt(t), big.NewInt(k.lim))
	if at.Cmp(base) < 0 {
		at.Set(base)
	}
	k.planned = at.Add(at, k.cost(units))
	k.denied, k.changed = true, true
	return time.Duration(t) * time.Microsecond
}

// state returns the row to store at now: tat, frac (in 1/lim
// microseconds) and the planned time (nil when nothing waits beyond tat).
func (k *rateKey) state(now time.Time) (time.Time, int64, *time.Time) {
	q, r := new(big.Int).QuoRem(k.spent, big.NewInt(k.lim), new(big.Int))
	tat := now.Add(time.Duration(q.Int64()) * time.Microsecond)
	if k.planned.Cmp(k.spent) <= 0 {
		return tat, r.Int64(), nil
	}
	p := now.Add(time.Duration(ceilDivBig(k.planned, k.lim)) * time.Microsecond)
	return tat, r.Int64(), &p
}

// ceilDivBig returns ceil(a / b) for b > 0, as an int64 (a is a time in
// microseconds scaled by b, so the quotient fits).
func ceilDivBig(a *big.Int, b int64) int64 {
	q, m := new(big.Int).DivMod(a, big.NewInt(b), new(big.Int)) // Euclidean: m >= 0
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

// rateUse returns how many units of a key's budget are spent at now, given
// its tat, and when the next one frees up (nil when none is).
func rateUse(lim, periodUS int64, now, tat time.Time) (int64, *time.Time) {
	left := tat.Sub(now).Microseconds()
	if left <= 0 {
		return 0, nil
	}
	// used = ceil(left*lim/period); the next unit frees when the spent
	// time drops to (used-1)*period/lim.
	scaled := new(big.Int).Mul(big.NewInt(left), big.NewInt(lim))
	used := min(ceilDivBig(scaled, periodUS), lim)
	rest := new(big.Int).Mul(big.NewInt(used-1), big.NewInt(periodUS))
	rest.Quo(rest, big.NewInt(lim))
	next := now.Add(time.Duration(left-rest.Int64()) * time.Microsecond)
	return used, &next
}
