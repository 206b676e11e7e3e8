package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/faultpoint"
	"github.com/stinthq/stint/store"
)

// PutSchedules stores schedules; see store.Store.
func (s *Store) PutSchedules(ctx context.Context, ss []api.Schedule, registered bool) error {
	if len(ss) == 0 {
		return nil
	}
	origin := "added"
	if registered {
		origin = "registered"
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, sc := range ss {
			params := string(sc.Params)
			if params == "" {
				params = "{}"
			}
			tag, err := tx.Exec(ctx, `
				INSERT INTO stint_schedule (name, behavior, spec, time_zone, params, origin)
				VALUES ($1, $2, $3, $4, $5::jsonb, $6)
				ON CONFLICT (name) DO UPDATE SET behavior = EXCLUDED.behavior, spec = EXCLUDED.spec,
				    time_zone = EXCLUDED.time_zone, params = EXCLUDED.params, updated_at = now()
				WHERE stint_schedule.origin = EXCLUDED.origin`,
				sc.Name, string(sc.Behavior), sc.Spec, sc.TimeZone, params, origin)
			if err != nil {
				return fmt.Errorf("store schedule %s: %w", sc.Name, err)
			}
			if tag.RowsAffected() == 0 {
				return fmt.Errorf("store schedule %s: %w: the name is taken by a schedule that was not %s", sc.Name, api.ErrConflict, origin)
			}
		}
		return nil
	})
}

// DeleteSchedule deletes a schedule; see store.Store.
func (s *Store) DeleteSchedule(ctx context.Context, name string) error {
	return s.deleteOne(ctx, "delete schedule "+name, `DELETE FROM stint_schedule WHERE name = $1`, name)
}

// Schedules lists the schedules; see store.Store.
func (s *Store) Schedules(ctx context.Context) ([]store.Schedule, time.Time, error) {
	var now time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, now, fmt.Errorf("list schedules: %w", err)
	}
	rows, err := s.pool.Query(ctx, `
		SELECT name, behavior, spec, time_zone, params, origin = 'registered', last_tick, created_at
		FROM stint_schedule ORDER BY name`)
	if err != nil {
		return nil, now, fmt.Errorf("list schedules: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Schedule, error) {
		var sc store.Schedule
		var params []byte
		err := row.Scan(&sc.Name, &sc.Behavior, &sc.Spec, &sc.TimeZone, &params, &sc.Registered, &sc.LastTick, &sc.CreatedAt)
		sc.Params = params
		return sc, err
	})
	if err != nil {
		return nil, now, fmt.Errorf("list schedules: %w", err)
	}
	return out, now, nil
}

// FireSchedule fires one tick of a schedule; see store.Store.
func (s *Store) FireSchedule(ctx context.Context, name string, last *time.Time, tick time.Time, task *store.NewTask) (bool, error) {
	fired := false
	err := holdingTx(ctx, s.pool, func(tx pgx.Tx) error {
		// A schedule locked by another node's firing is skipped, not
		// waited for: that node may be stopped inside its transaction,
		// and the schedules of every node would wait on it. The tick is
		// fired by another node once the server ended that transaction
		// (see holdIdleTimeout).
		tag, err := tx.Exec(ctx, `
			UPDATE stint_schedule s SET last_tick = $3
			FROM (SELECT name FROM stint_schedule WHERE name = $1 AND last_tick IS NOT DISTINCT FROM $2
			      FOR UPDATE SKIP LOCKED) l
			WHERE s.name = l.name`,
			name, last, tick)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		faultpoint.Reach(faultpoint.ScheduleFire)
		if task != nil {
			if _, _, err := submitOn(ctx, tx, []store.NewTask{*task}, "", false); err != nil {
				return err
			}
		}
		fired = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("fire schedule %s at %s: %w", name, tick.Format(time.RFC3339), err)
	}
	return fired, nil
}
