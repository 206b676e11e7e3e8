package postgres

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/faultpoint"
	"github.com/stinthq/stint/store"
)

// SetRateLimit stores a rate limit; see store.Limits. Each key keeps the
// units it spent, not the time they stand for: its tat is rescaled to the
// new time per unit (rounded up), so a raised limit admits a key's next
// task as soon as the new rule does, and a lowered one holds back a key
// that spent more than the new burst. The limit's row is locked, as claims
// share-lock it, so no claim spends a key's budget under the old values
// after the change; claims wait for the change while it holds the row
// (holdIdleTimeout bounds that for a stopped process).
func (s *Store) SetRateLimit(ctx context.Context, l api.RateLimit) error {
	err := holdingTx(ctx, s.pool, func(tx pgx.Tx) error {
		var oldLim, oldPeriod int64
		err := tx.QueryRow(ctx, `SELECT lim, period_us FROM stint_rate_limit WHERE name = $1 FOR UPDATE`, l.Name).Scan(&oldLim, &oldPeriod)
		if err != nil && !isNoRows(err) {
			return err
		}
		faultpoint.Reach(faultpoint.RateLimitSet)
		period := l.Period.Microseconds()
		if _, err := tx.Exec(ctx, `INSERT INTO stint_rate_limit (name, lim, period_us) VALUES ($1, $2, $3)
			ON CONFLICT (name) DO UPDATE SET lim = excluded.lim, period_us = excluded.period_us, updated_at = now()`,
			l.Name, l.Limit, period); err != nil {
			return err
		}
		if err == nil && (oldLim != l.Limit || oldPeriod != period) {
			if _, err := tx.Exec(ctx, rescaleRateKeysSQL, l.Name, period, oldLim, l.Limit, oldPeriod); err != nil {
				return err
			}
		}
		return freeRateWaiters(ctx, tx, l.Name)
	})
	if err != nil {
		return fmt.Errorf("set rate limit %q: %w", l.Name, err)
	}
	return nil
}

// RemoveRateLimit deletes a rate limit and its keys' state; see
// store.Limits.
func (s *Store) RemoveRateLimit(ctx context.Context, name string) error {
	what := fmt.Sprintf("remove rate limit %q", name)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM stint_rate_limit WHERE name = $1`, name)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return api.ErrNotFound
		}
		return freeRateWaiters(ctx, tx, name)
	})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// rescaleRateKeysSQL rescales the tat of each key of the limit $1 whose
// budget is not full from the old time per unit ($5 microseconds per $3
// units) to the new ($2 per $4), keeping the units spent.
const rescaleRateKeysSQL = `UPDATE stint_rate_key SET
    tat = now() + ceil((extract(epoch FROM tat - now()) * 1e6 + frac::float8 / frac_lim)
        * $2::float8 * $3::float8 / ($4::float8 * $5::float8)) * interval '1 microsecond',
    frac = 0, frac_lim = 1
WHERE name = $1 AND tat > now()`

// freeRateWaitersSQL makes the tasks that claims held back under the rate
// limit $1 (moved to when its old values admitted them) due at once, with
// a fresh claim hint each (the old ones are stale and dropped where a claim
// finds them), forgets when the limit's keys planned to admit them, and
// wakes the claimers. The next claim weighs them against the limit as it
// is now: a raised or removed limit frees them at once, a lowered one
// holds them back again. The tasks are found through stint_task_waiting,
// which holds only waiting tasks.
var freeRateWaitersSQL = `
WITH u AS (
    UPDATE stint_task SET schedule_not_before = now(), waiting = NULL, updated_at = now()
    WHERE waiting IS NOT NULL AND (waiting->>'limit') = $1 AND status IN ` + waitingStatuses + `
      AND schedule_not_before > now()
    RETURNING id, behavior, parent_id, priority, schedule_not_before, group_key, status
), due AS (` + dueInsert("u") + `
), planned AS (
    UPDATE stint_rate_key SET planned = NULL WHERE name = $1 AND planned IS NOT NULL
)
SELECT pg_notify($2, '') FROM (SELECT 1 FROM u LIMIT 1) x`

// freeRateWaiters runs freeRateWaitersSQL for the limit name in tx, with
// sequential scans off: the waiting tasks are found through their index
// however large the task table has grown since it was last analyzed.
func freeRateWaiters(ctx context.Context, tx pgx.Tx, name string) error {
	_, err := indexed(ctx, tx, nil, freeRateWaitersSQL, name, store.ChannelDue)
	return err
}

// deleteOne runs query, a DELETE, and returns api.ErrNotFound when it
// deleted nothing; what says what it did, in errors.
func (s *Store) deleteOne(ctx context.Context, what, query string, args ...any) error {
	tag, err := s.pool.Exec(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%s: %w", what, api.ErrNotFound)
	}
	return nil
}

// rateLimitsSQL lists the limits, the state of their keys whose budget is
// not full, and the tasks waiting on each key (through stint_task_waiting,
// which holds only waiting tasks).
var rateLimitsSQL = `
WITH w AS (
    SELECT waiting->>'limit' AS name, coalesce(waiting->>'key', '') AS key, count(*) AS n
    FROM stint_task WHERE waiting IS NOT NULL AND waiting->>'limit' IS NOT NULL
        AND status IN ` + waitingStatuses + ` AND schedule_not_before IS NOT NULL
    GROUP BY 1, 2
), k AS (
    SELECT coalesce(r.name, w.name) AS name, coalesce(r.key, w.key) AS key, r.tat, coalesce(w.n, 0) AS n
    FROM (SELECT name, key, tat FROM stint_rate_key WHERE tat > now()) r
    FULL JOIN w ON w.name = r.name AND w.key = r.key
)
SELECT l.name, l.lim, l.period_us, now(), k.key, k.tat, coalesce(k.n, 0)
FROM stint_rate_limit l LEFT JOIN k ON k.name = l.name
ORDER BY l.name, k.key`

// RateLimits lists the rate limits with their use; see store.Limits.
func (s *Store) RateLimits(ctx context.Context) ([]api.RateLimitInfo, error) {
	rows, err := s.pool.Query(ctx, rateLimitsSQL)
	if err != nil {
		return nil, fmt.Errorf("list rate limits: %w", err)
	}
	var out []api.RateLimitInfo
	var name string
	var lim, periodUS, n int64
	var now time.Time
	var key *string
	var tat *time.Time
	_, err = pgx.ForEachRow(rows, []any{&name, &lim, &periodUS, &now, &key, &tat, &n}, func() error {
		if len(out) == 0 || out[len(out)-1].Name != name {
			out = append(out, api.RateLimitInfo{RateLimit: api.RateLimit{Name: name, Limit: lim,
				Period: time.Duration(periodUS) * time.Microsecond}})
		}
		if key == nil {
			return nil
		}
		info := &out[len(out)-1]
		k := api.RateKeyInfo{Key: *key, Waiting: int(n)}
		if tat != nil {
			k.Used, k.NextFree = rateUse(lim, periodUS, now, *tat)
		}
		info.Keys = append(info.Keys, k)
		info.Waiting += int(n)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list rate limits: %w", err)
	}
	return out, nil
}

// EnsureRateLimits stores the declared limits among names that are not
// stored yet and returns the stored limits of names; see store.Limits.
//
// A declared limit that another submit stores at the same moment is
// inserted by neither statement as this one sees it: its insert waits for
// the other's and does nothing, and its read's snapshot is older than the
// other's commit. The statement is then run again, once, to read it.
func (s *Store) EnsureRateLimits(ctx context.Context, declared []api.RateLimit, names []string) (map[string]api.RateLimit, error) {
	var dn []string
	var dl, dp []int64
	for _, l := range declared {
		dn, dl, dp = append(dn, l.Name), append(dl, l.Limit), append(dp, l.Period.Microseconds())
	}
	out := map[string]api.RateLimit{}
	for try := 0; try < 2; try++ {
		rows, err := s.pool.Query(ctx, ensureRateLimitsSQL, dn, dl, dp, names)
		if err != nil {
			return nil, fmt.Errorf("look up rate limits: %w", err)
		}
		var l api.RateLimit
		var periodUS int64
		if _, err := pgx.ForEachRow(rows, []any{&l.Name, &l.Limit, &periodUS}, func() error {
			l.Period = time.Duration(periodUS) * time.Microsecond
			out[l.Name] = l
			return nil
		}); err != nil {
			return nil, fmt.Errorf("look up rate limits: %w", err)
		}
		if !slices.ContainsFunc(dn, func(n string) bool { _, ok := out[n]; return !ok && slices.Contains(names, n) }) {
			break
		}
	}
	return out, nil
}

// ensureRateLimitsSQL inserts the declared limits ($1 names, $2 limits,
// $3 periods in microseconds) among the names $4 that are not stored, and
// returns the stored limits of $4 with those it inserted.
const ensureRateLimitsSQL = `
WITH d AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS d(name, lim, period_us)
    WHERE d.name = ANY($4::text[])
), ins AS (
    INSERT INTO stint_rate_limit (name, lim, period_us)
    SELECT d.name, d.lim, d.period_us FROM d
    WHERE NOT EXISTS (SELECT 1 FROM stint_rate_limit l WHERE l.name = d.name)
    ON CONFLICT (name) DO NOTHING
    RETURNING name, lim, period_us
)
SELECT name, lim, period_us FROM stint_rate_limit WHERE name = ANY($4::text[])
UNION ALL SELECT name, lim, period_us FROM ins`

// uncapped returns the condition, for a statement that starts tasks of
// behavior without counting (a plain claim, a local start), that no cap
// set at runtime binds the behavior. It also takes the behavior's advisory
// lock in shared mode, or leaves the behavior out when a claim that counts
// it, or SetConcurrencyLimit, holds it: a cap stored while such a
// statement is under way (its snapshot older than the cap) waits for it
// to commit before SetConcurrencyLimit returns, so that every claim that
// counts after that sees its starts.
func uncapped(behavior string) string {
	return `NOT EXISTS (SELECT 1 FROM stint_concurrency cc WHERE cc.behavior = ` + behavior + ` AND cc.max > 0)
      AND pg_try_advisory_xact_lock_shared(hashtextextended('stint.cap:' || ` + behavior + `, 0))`
}

// SetConcurrencyLimit stores a cap and wakes the claimers, for whom a
// raised cap may free slots; see store.Limits. Once the cap is stored, it
// takes and drops the behavior's advisory lock: the statements that
// started tasks of the behavior without seeing the cap (see uncapped) have
// committed when it returns. It does so in one statement, its transaction
// implicit, so that no round trip to this process happens while it holds
// the lock, which every claim of the behavior waits for or skips.
func (s *Store) SetConcurrencyLimit(ctx context.Context, l api.ConcurrencyLimit) error {
	if err := s.setConcurrencyLimit(ctx, l); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('stint.cap:' || $1, 0))`, string(l.Behavior))
	if err != nil {
		return fmt.Errorf("set concurrency limit of %s %q: %w", l.Behavior, l.Key, err)
	}
	return nil
}

func (s *Store) setConcurrencyLimit(ctx context.Context, l api.ConcurrencyLimit) error {
	_, err := s.pool.Exec(ctx, `
		WITH u AS (
		    INSERT INTO stint_concurrency (behavior, key, max, weight) VALUES ($1, $2, $3, $4)
		    ON CONFLICT (behavior, key) DO UPDATE SET max = excluded.max, weight = excluded.weight, updated_at = now()
		    RETURNING 1)
		SELECT pg_notify($5, '') FROM u`, string(l.Behavior), l.Key, l.Max, max(l.Weight, 1), store.ChannelDue)
	if err != nil {
		return fmt.Errorf("set concurrency limit of %s %q: %w", l.Behavior, l.Key, err)
	}
	return nil
}

// RemoveConcurrencyLimit deletes a cap and wakes the claimers; see
// store.Limits.
func (s *Store) RemoveConcurrencyLimit(ctx context.Context, behavior api.BehaviorID, key string) error {
	var n int
	err := s.pool.QueryRow(ctx, `
		WITH d AS (DELETE FROM stint_concurrency WHERE behavior = $1 AND key = $2 RETURNING 1)
		SELECT count(*) FROM d, pg_notify($3, '') n`, string(behavior), key, store.ChannelDue).Scan(&n)
	if err != nil {
		return fmt.Errorf("remove concurrency limit of %s %q: %w", behavior, key, err)
	}
	if n == 0 {
		return fmt.Errorf("remove concurrency limit of %s %q: %w", behavior, key, api.ErrNotFound)
	}
	return nil
}

// runningSQL counts the running tasks of the behavior $1 by group key (the
// empty key for none), leaving out the tasks $2 under the leases $3 (a
// node's runs that returned; see store.ClaimRequest.Returned). It finds them through the behavior's lease rows, each task of each
// lease by primary key (its lease's membership a hashed lookup, never a
// join): a task counts while it runs under a lease that is still stored,
// so its slot is freed exactly when its run ends (a finish, a release, a
// removal) or its lease ends (a takeover), never twice. Its cost grows with
// the behavior's running tasks, not with the queue nor with other
// behaviors.
const runningSQL = `
SELECT coalesce(t.group_key, ''), count(*)::int FROM stint_task t
WHERE t.id = ANY(ARRAY(SELECT unnest(l.task_ids) FROM stint_lease l WHERE l.behavior = $1))
  AND t.status = 'running' AND t.behavior = $1
  AND (t.lease IN (SELECT l.lease FROM stint_lease l WHERE l.behavior = $1)) IS TRUE
  AND ((t.id, t.lease) IN (SELECT * FROM unnest($2::text[], $3::uuid[]))) IS NOT TRUE
GROUP BY 1`

// runningOf counts the running tasks of behavior by group key, in all
// under "" when the behavior's tasks have no key... see runningSQL. The
// total is returned apart.
func runningOf(ctx context.Context, q querier, behavior string, returned []store.LeaseRef) (map[string]int, int, error) {
	ids, leases := leaseRefArrays(returned)
	return readRunning(q.Query(ctx, runningSQL, behavior, ids, leases))
}

// readRunning reads runningSQL's rows: the counts by key and their total.
func readRunning(rows pgx.Rows, err error) (map[string]int, int, error) {
	if err != nil {
		return nil, 0, err
	}
	byKey := map[string]int{}
	total := 0
	var k string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&k, &n}, func() error {
		byKey[k] = n
		total += n
		return nil
	})
	return byKey, total, err
}

// ConcurrencyLimits lists the caps set at runtime with their use; see
// store.Limits.
func (s *Store) ConcurrencyLimits(ctx context.Context) ([]api.ConcurrencyInfo, error) {
	var out []api.ConcurrencyInfo
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT behavior, key, max, weight FROM stint_concurrency ORDER BY behavior, key`)
		if err != nil {
			return err
		}
		var c api.ConcurrencyInfo
		if _, err := pgx.ForEachRow(rows, []any{&c.Behavior, &c.Key, &c.Max, &c.Weight}, func() error {
			out = append(out, c)
			return nil
		}); err != nil {
			return err
		}
		running := map[api.BehaviorID]map[string]int{}
		totals := map[api.BehaviorID]int{}
		for i := range out {
			c := &out[i]
			if _, ok := running[c.Behavior]; !ok {
				if running[c.Behavior], totals[c.Behavior], err = runningOf(ctx, tx, string(c.Behavior), nil); err != nil {
					return err
				}
			}
			if c.Key == "" {
				c.Running = totals[c.Behavior]
			} else {
				c.Running = running[c.Behavior][c.Key]
			}
			if c.Max > 0 && c.Running >= c.Max {
				if c.Waiting, err = dueCount(ctx, tx, c.Behavior, c.Key); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list concurrency limits: %w", err)
	}
	return out, nil
}

// dueCount counts the due tasks of behavior (of its group key, if not
// empty), which a full cap holds back. It counts at most 10,000: a view of
// the backlog, not a statement on the claim's path.
func dueCount(ctx context.Context, q querier, behavior api.BehaviorID, key string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM stint_due d
		JOIN stint_task t ON `+hintMatches("t", "d")+`
		WHERE NOT d.parked AND d.behavior = $1 AND d.due <= now() AND ($2 = '' OR d.group_key = $2)
		LIMIT 10000) c`, string(behavior), key).Scan(&n)
	return n, err
}

// CappedBehaviors lists the behaviors with a runtime cap; see
// store.Limits.
func (s *Store) CappedBehaviors(ctx context.Context) ([]api.BehaviorID, error) {
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT behavior FROM stint_concurrency WHERE max > 0 ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("list capped behaviors: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[api.BehaviorID])
	if err != nil {
		return nil, fmt.Errorf("list capped behaviors: %w", err)
	}
	return out, nil
}

// dueBehaviorsSQL returns those of the behaviors $1 with a hint due within
// the look-ahead $2: one probe of the claim index each.
var dueBehaviorsSQL = `SELECT b FROM unnest($1::text[]) AS b WHERE ` + hasDueHint("b", "$2")

// hasDueHint returns the condition that the behavior has a claim hint due
// within the look-ahead (in microseconds): one probe of the claim index.
func hasDueHint(behavior, lookAhead string) string {
	return `EXISTS (SELECT 1 FROM stint_due d WHERE NOT d.parked AND d.behavior = ` + behavior + `
    AND d.due <= now() + ` + lookAhead + ` * interval '1 microsecond')`
}

// DueBehaviors returns the behaviors with a task due; see store.Limits.
func (s *Store) DueBehaviors(ctx context.Context, behaviors []api.BehaviorID, lookAhead time.Duration) ([]api.BehaviorID, error) {
	var out []api.BehaviorID
	_, err := indexed(ctx, s.pool, func(rows pgx.Rows) error {
		var err error
		out, err = pgx.CollectRows(rows, pgx.RowTo[api.BehaviorID])
		return err
	}, dueBehaviorsSQL, behaviors, lookAhead.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("find behaviors with due tasks: %w", err)
	}
	return out, nil
}

// ConcurrencyWait says which full cap a due task waits on; see
// store.Limits.
func (s *Store) ConcurrencyWait(ctx context.Context, behavior api.BehaviorID, key string, cluster, perGroup int) (*api.Wait, error) {
	rows, err := s.pool.Query(ctx, `SELECT key, max FROM stint_concurrency
		WHERE behavior = $1 AND key IN ('', $2) AND max > 0`, string(behavior), key)
	if err != nil {
		return nil, fmt.Errorf("concurrency wait of %s %q: %w", behavior, key, err)
	}
	var k string
	var m int
	if _, err := pgx.ForEachRow(rows, []any{&k, &m}, func() error {
		if k == "" {
			cluster = m
		} else {
			perGroup = m
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("concurrency wait of %s %q: %w", behavior, key, err)
	}
	if key == "" {
		perGroup = 0
	}
	if cluster <= 0 && perGroup <= 0 {
		return nil, nil
	}
	byKey, total, err := runningOf(ctx, s.pool, string(behavior), nil)
	switch {
	case err != nil:
		return nil, fmt.Errorf("concurrency wait of %s %q: %w", behavior, key, err)
	case cluster > 0 && total >= cluster:
		return &api.Wait{Reason: api.WaitConcurrency, Limit: string(behavior)}, nil
	case perGroup > 0 && byKey[key] >= perGroup:
		return &api.Wait{Reason: api.WaitConcurrency, Limit: string(behavior), Key: key}, nil
	}
	return nil, nil
}
