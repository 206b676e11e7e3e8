package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// historyBucket is the SQL of the start of the history bucket that holds
// a time: api.HistoryBucket wide, counted from the Unix epoch.
func historyBucket(t string) string { return historyBin(api.HistoryBucket, t) }

// historySampleEvery is how often the backlog is sampled: the first node
// to record in each slot this wide takes a sample, and a bucket keeps the
// largest of its slots' samples. A backlog that comes and goes within a
// minute shows in its bucket, where a single sample per bucket would miss
// it.
const historySampleEvery = 10 * time.Second

// historyBin is the SQL of the start of the slot width wide that holds a
// time, counted from the Unix epoch.
func historyBin(width time.Duration, t string) string {
	return fmt.Sprintf("date_bin('%d seconds', %s, timestamptz 'epoch')", int(width/time.Second), t)
}

// The statements that read and trim the history walk the primary keys,
// which lead with the bucket, from the window's start or up to the
// retention's, after historySettingsSQL in their transaction: without
// statistics (a table never analyzed) the planner would read the whole
// table and sort it.
const (
	historySettingsSQL = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
		set_config('enable_sort', 'off', true)`
	historyReadSQL = `SELECT behavior, bucket, succeeded, failed, retried, due, lag_us FROM stint_history
		WHERE bucket >= $1 ORDER BY bucket, behavior`
	historyTrimSQL       = `DELETE FROM stint_history WHERE bucket < now() - $1::interval`
	historySampleTrimSQL = `DELETE FROM stint_history_sample WHERE bucket < now() - $1::interval`
)

// historyRetention is api.HistoryRetention as an interval.
var historyRetention = fmt.Sprintf("%d seconds", int(api.HistoryRetention/time.Second))

// RecordHistory adds a node's run ends to the current bucket and samples
// the backlog once per historySampleEvery; see store.Store. The counts are one
// statement on their own: every node adds to the same rows, and a
// transaction that also waited for the sample's row could deadlock with
// the node that samples. Rows are written in behavior order, so that two
// nodes' statements lock them in the same order.
func (s *Store) RecordHistory(ctx context.Context, r store.HistoryRecord) (bool, error) {
	if len(r.Counts) > 0 {
		counts := slices.SortedFunc(slices.Values(r.Counts), func(a, b store.HistoryCount) int { return cmp.Compare(a.Behavior, b.Behavior) })
		n := len(counts)
		behaviors, succeeded, failed, retried := make([]string, n), make([]int64, n), make([]int64, n), make([]int64, n)
		for i, c := range counts {
			behaviors[i], succeeded[i], failed[i], retried[i] = string(c.Behavior), c.Succeeded, c.Failed, c.Retried
		}
		_, err := s.pool.Exec(ctx, `
			INSERT INTO stint_history (bucket, behavior, succeeded, failed, retried)
			SELECT `+historyBucket("now()")+`, u.* FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS u
			ON CONFLICT (bucket, behavior) DO UPDATE SET
				succeeded = stint_history.succeeded + EXCLUDED.succeeded,
				failed = stint_history.failed + EXCLUDED.failed,
				retried = stint_history.retried + EXCLUDED.retried`,
			behaviors, succeeded, failed, retried)
		if err != nil {
			return false, fmt.Errorf("record history: %w", err)
		}
	}
	if !r.Sample {
		return false, nil
	}
	var sampled bool
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		// The first node to insert the slot's sample row takes the
		// sample; another one waits for its commit and inserts nothing.
		var now time.Time
		err := tx.QueryRow(ctx, `
			INSERT INTO stint_history_sample (bucket) VALUES (`+historyBin(historySampleEvery, "now()")+`)
			ON CONFLICT DO NOTHING RETURNING taken_at`).Scan(&now)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("claim the sample: %w", err)
		}
		due, err := readDue(ctx, tx, now, false)
		if err != nil {
			return err
		}
		byBehavior := map[api.BehaviorID]store.DueCount{}
		for _, b := range r.Behaviors {
			byBehavior[b] = store.DueCount{Behavior: b}
		}
		for _, d := range due {
			byBehavior[d.Behavior] = d
		}
		behaviors := slices.Sorted(func(yield func(api.BehaviorID) bool) {
			for b := range byBehavior {
				if !yield(b) {
					return
				}
			}
		})
		names, counts, lags := make([]string, len(behaviors)), make([]int64, len(behaviors)), make([]int64, len(behaviors))
		for i, b := range behaviors {
			d := byBehavior[b]
			names[i], counts[i], lags[i] = string(b), d.Count, d.OldestAge.Microseconds()
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO stint_history (bucket, behavior, due, lag_us)
			SELECT `+historyBucket("now()")+`, u.* FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u
			ON CONFLICT (bucket, behavior) DO UPDATE SET due = greatest(stint_history.due, EXCLUDED.due),
				lag_us = greatest(stint_history.lag_us, EXCLUDED.lag_us)`,
			names, counts, lags); err != nil {
			return fmt.Errorf("record the sample: %w", err)
		}
		if _, err := tx.Exec(ctx, historySettingsSQL); err != nil {
			return fmt.Errorf("trim history: %w", err)
		}
		if _, err := tx.Exec(ctx, historyTrimSQL, historyRetention); err != nil {
			return fmt.Errorf("trim history: %w", err)
		}
		if _, err := tx.Exec(ctx, historySampleTrimSQL, historyRetention); err != nil {
			return fmt.Errorf("trim history samples: %w", err)
		}
		sampled = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("record history: %w", err)
	}
	return sampled, nil
}

// History reads the points of the last window, at most
// api.HistoryRetention, walking the primary key from the window's first
// bucket.
func (s *Store) History(ctx context.Context, window time.Duration) (api.History, error) {
	if window <= 0 || window > api.HistoryRetention {
		return api.History{}, &api.InvalidError{Field: "window",
			Reason: fmt.Sprintf("%s: want more than 0 and at most %s", window, api.HistoryRetention)}
	}
	h := api.History{Bucket: api.HistoryBucket, Points: []api.HistoryPoint{}}
	err := s.reading(ctx, func(db *pgxpool.Pool, _ bool) error {
		return pgx.BeginTxFunc(ctx, db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			h.Points = h.Points[:0]
			if _, err := tx.Exec(ctx, historySettingsSQL); err != nil {
				return err
			}
			span := fmt.Sprintf("%d microseconds", window.Microseconds())
			if err := tx.QueryRow(ctx, `SELECT now(), `+historyBucket("now() - $1::interval"), span).Scan(&h.Now, &h.From); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, historyReadSQL, h.From)
			if err != nil {
				return err
			}
			var p api.HistoryPoint
			var due, lag *int64
			_, err = pgx.ForEachRow(rows, []any{&p.Behavior, &p.At, &p.Succeeded, &p.Failed, &p.Retried, &due, &lag}, func() error {
				p.Sampled, p.Due, p.QueueLag = due != nil, 0, 0
				if due != nil {
					p.Due = *due
				}
				if lag != nil {
					p.QueueLag = time.Duration(*lag) * time.Microsecond
				}
				h.Points = append(h.Points, p)
				return nil
			})
			return err
		})
	})
	// Read in the primary key's order; the history is by behavior.
	slices.SortStableFunc(h.Points, func(a, b api.HistoryPoint) int { return cmp.Compare(a.Behavior, b.Behavior) })
	if err != nil {
		return api.History{}, fmt.Errorf("read history: %w", err)
	}
	return h, nil
}
