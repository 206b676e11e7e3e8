package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// RegisterNode records a node as started, as one that reads a workflow
// node's single dependency in its column (see singleDepsOpen).
func (s *Store) RegisterNode(ctx context.Context, n store.Node) error {
	behaviors := make([]string, len(n.Behaviors))
	for i, b := range n.Behaviors {
		behaviors[i] = string(b)
	}
	var versions []byte
	if len(n.BehaviorVersions) > 0 {
		versions, _ = json.Marshal(n.BehaviorVersions) // a map of strings to numbers: cannot fail
	}
	_, err := s.pool.Exec(ctx, `
		INSERT INTO stint_node (id, host, pid, behaviors, max_workers, version, behavior_versions, reads_depends_on)
		VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''), $7::jsonb, true)
		ON CONFLICT (id) DO UPDATE SET host = $2, pid = $3, behaviors = $4, max_workers = $5, version = NULLIF($6, ''),
		    behavior_versions = $7::jsonb, started_at = now(), heartbeat_at = now(), reads_depends_on = true`,
		n.ID, n.Host, n.PID, behaviors, n.MaxWorkers, n.Version, versions)
	if err != nil {
		return fmt.Errorf("register node %s: %w", n.ID, err)
	}
	return nil
}

// HeartbeatNode renews a node's heartbeat and records its health.
func (s *Store) HeartbeatNode(ctx context.Context, id string, health store.NodeHealth) error {
	var incidents, last []byte
	var err error
	if len(health.Incidents) > 0 {
		if incidents, err = json.Marshal(health.Incidents); err != nil {
			return fmt.Errorf("heartbeat node %s: %w", id, err)
		}
	}
	if health.Last != nil {
		if last, err = json.Marshal(health.Last); err != nil {
			return fmt.Errorf("heartbeat node %s: %w", id, err)
		}
	}
	tag, err := s.lease.Exec(ctx, `UPDATE stint_node SET heartbeat_at = now(), incidents = $2, last_incident = $3 WHERE id = $1`,
		id, incidents, last)
	if err != nil {
		return fmt.Errorf("heartbeat node %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("heartbeat node %s: %w", id, api.ErrNotFound)
	}
	return nil
}

// DeregisterNode removes a node.
func (s *Store) DeregisterNode(ctx context.Context, id string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM stint_node WHERE id = $1`, id); err != nil {
		return fmt.Errorf("deregister node %s: %w", id, err)
	}
	return nil
}

// Nodes lists registered nodes, oldest first.
func (s *Store) Nodes(ctx context.Context) ([]store.Node, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, host, pid, behaviors, max_workers, started_at, heartbeat_at, incidents, last_incident,
		    coalesce(version, ''), (extract(epoch FROM now() - heartbeat_at) * 1000000)::bigint, behavior_versions
		FROM stint_node ORDER BY started_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var out []store.Node
	var n store.Node
	var behaviors []string
	var incidents, last, versions []byte
	var ageUS int64
	_, err = pgx.ForEachRow(rows, []any{&n.ID, &n.Host, &n.PID, &behaviors, &n.MaxWorkers, &n.StartedAt, &n.HeartbeatAt, &incidents, &last, &n.Version, &ageUS, &versions}, func() error {
		n.HeartbeatAge = time.Duration(ageUS) * time.Microsecond
		n.Incidents, n.LastIncident, n.BehaviorVersions = nil, nil, nil
		if versions != nil {
			if err := json.Unmarshal(versions, &n.BehaviorVersions); err != nil {
				return fmt.Errorf("node %s: behavior versions: %w", n.ID, err)
			}
		}
		if incidents != nil {
			if err := json.Unmarshal(incidents, &n.Incidents); err != nil {
				return fmt.Errorf("node %s: incidents: %w", n.ID, err)
			}
		}
		if last != nil {
			n.LastIncident = new(api.NodeIncident)
			if err := json.Unmarshal(last, n.LastIncident); err != nil {
				return fmt.Errorf("node %s: last incident: %w", n.ID, err)
			}
		}
		n.Behaviors = make([]api.BehaviorID, len(behaviors))
		for i, b := range behaviors {
			n.Behaviors[i] = api.BehaviorID(b)
		}
		out = append(out, n)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}

// RunningOn counts the running tasks whose lease each of nodes holds.
func (s *Store) RunningOn(ctx context.Context, nodes []string) ([]store.NodeRunning, error) {
	if nodes == nil {
		nodes = []string{}
	}
	var now time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, fmt.Errorf("count running tasks of nodes: %w", err)
	}
	return runningByNode(ctx, s.pool, now, nodes)
}

// runningByNode counts the running tasks per node that holds their lease,
// and of them those whose lease expired by now; nodes, unless nil, names
// the nodes to count.
func runningByNode(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, now time.Time, nodes []string) ([]store.NodeRunning, error) {
	rows, err := db.Query(ctx, `
		SELECT l.node, count(*), count(*) FILTER (WHERE l.expires_at <= $1) FROM stint_lease l
		JOIN stint_task t ON t.id = ANY(l.task_ids) AND t.lease = l.lease AND t.status = 'running'
		WHERE $2::text[] IS NULL OR l.node = ANY($2::text[])
		GROUP BY 1 ORDER BY 1`, now, nodes)
	if err != nil {
		return nil, fmt.Errorf("count running tasks: %w", err)
	}
	var out []store.NodeRunning
	var n store.NodeRunning
	if _, err := pgx.ForEachRow(rows, []any{&n.Node, &n.Running, &n.Expired}, func() error {
		out = append(out, n)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count running tasks: %w", err)
	}
	return out, nil
}
