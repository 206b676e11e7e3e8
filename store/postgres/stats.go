package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
)

// Stats is a snapshot of the tasks for operators, read in one transaction
// so that its numbers agree with each other, and timed by the database's
// clock.
//
// It lives here until the store contract grows a statistics method (a
// store.Stats type and a Store.Stats method); the HTTP API is its user.
type Stats struct {
	// Now is the database's clock at the snapshot.
	Now time.Time
	// Counts are the tasks per behavior and status; absent pairs are zero.
	Counts []StatusCount
	// Due are the tasks per behavior that are due now and waiting for a
	// worker: not running, not held, not in a held group.
	Due []DueCount
	// Running are the running tasks per node.
	Running []NodeRunning
}

// StatusCount is the number of tasks of a behavior in a status.
type StatusCount struct {
	Behavior api.BehaviorID
	Status   api.Status
	Count    int64
}

// DueCount is the backlog of one behavior.
type DueCount struct {
	Behavior api.BehaviorID
	// Count is the number of tasks due now.
	Count int64
	// OldestAge is how long the longest-waiting of them has been due: the
	// queue lag.
	OldestAge time.Duration
}

// NodeRunning counts the running tasks of one node.
type NodeRunning struct {
	Node string
	// Running is the number of tasks whose lease the node holds.
	Running int64
	// Expired is how many of them have an expired lease: tasks of a node
	// that stopped renewing, waiting to be taken over.
	Expired int64
}

// Stats reads the task statistics. Counting per behavior and status reads
// the whole task table; the backlog and running counts read only the rows
// with a due time, through the claim index.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&st.Now); err != nil {
			return fmt.Errorf("read the clock: %w", err)
		}
		rows, err := tx.Query(ctx, `SELECT behavior, status, count(*) FROM stint_task GROUP BY behavior, status ORDER BY behavior, status`)
		if err != nil {
			return fmt.Errorf("count tasks: %w", err)
		}
		var c StatusCount
		if _, err := pgx.ForEachRow(rows, []any{&c.Behavior, &c.Status, &c.Count}, func() error {
			st.Counts = append(st.Counts, c)
			return nil
		}); err != nil {
			return fmt.Errorf("count tasks: %w", err)
		}
		rows, err = tx.Query(ctx, `
			SELECT behavior, count(*), min(schedule_not_before) FROM stint_task t
			WHERE schedule_not_before <= now() AND status <> 'running'
			  AND (group_key IS NULL OR NOT EXISTS (SELECT 1 FROM stint_hold h WHERE h.group_key = t.group_key))
			GROUP BY behavior ORDER BY behavior`)
		if err != nil {
			return fmt.Errorf("count due tasks: %w", err)
		}
		var d DueCount
		var oldest time.Time
		if _, err := pgx.ForEachRow(rows, []any{&d.Behavior, &d.Count, &oldest}, func() error {
			d.OldestAge = max(st.Now.Sub(oldest), 0)
			st.Due = append(st.Due, d)
			return nil
		}); err != nil {
			return fmt.Errorf("count due tasks: %w", err)
		}
		rows, err = tx.Query(ctx, `
			SELECT coalesce(node, ''), count(*), count(*) FILTER (WHERE lost_not_before <= now()) FROM stint_task
			WHERE status = 'running' AND schedule_not_before IS NOT NULL
			GROUP BY 1 ORDER BY 1`)
		if err != nil {
			return fmt.Errorf("count running tasks: %w", err)
		}
		var n NodeRunning
		if _, err := pgx.ForEachRow(rows, []any{&n.Node, &n.Running, &n.Expired}, func() error {
			st.Running = append(st.Running, n)
			return nil
		}); err != nil {
			return fmt.Errorf("count running tasks: %w", err)
		}
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("read stats: %w", err)
	}
	return st, nil
}
