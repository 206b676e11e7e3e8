package postgres

// A workflow node's dependencies: the one it was submitted with, when it
// had one, in its task's column depends_on; the others, and those a growth
// added, as edge rows in stint_dependency.

import (
	"context"
	"sync"
	"time"
)

// singleDepsRecheck is how long a store that found a node of an earlier
// release registered waits before it looks again (see singleDepsOpen).
const singleDepsRecheck = 5 * time.Second

// singleDepsGate remembers whether workflows may be submitted with a
// node's single dependency in its column. Once open it stays open: a
// node of an earlier release refuses to start against the schema that
// brings the column, so none registers after the last one left.
type singleDepsGate struct {
	mu      sync.Mutex
	open    bool
	checked time.Time
}

// singleDepsOpen reports whether every registered node reads depends_on,
// so that a workflow's nodes of one dependency may keep it in their
// column rather than in an edge row, which is all a node of an earlier
// release reads. While one is registered, it asks the database again at
// most every singleDepsRecheck; an error counts as closed.
func (s *Store) singleDepsOpen(ctx context.Context) bool {
	g := &s.singleDeps
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open || time.Since(g.checked) < singleDepsRecheck && !g.checked.IsZero() {
		return g.open
	}
	g.checked = time.Now()
	var open bool
	if err := s.pool.QueryRow(ctx, singleDepsOpenSQL).Scan(&open); err == nil {
		g.open = open
	}
	return g.open
}

// singleDepsOpenSQL says whether every registered node reads depends_on.
const singleDepsOpenSQL = `SELECT NOT EXISTS (SELECT 1 FROM stint_node WHERE NOT reads_depends_on)`

// edgesByDependency is the subquery of the nodes that depend on the task
// id expr, by either index: stint_dependency's primary key and
// stint_task_depends_on. OFFSET 0 keeps each an index probe of its own
// rather than a join the planner may turn into a scan of a whole index.
func edgesByDependency(expr string) string {
	return `(SELECT e.task_id FROM stint_dependency e WHERE e.depends_on = ` + expr + ` OFFSET 0)
        UNION ALL (SELECT c.id FROM stint_task c WHERE c.depends_on = ` + expr + ` OFFSET 0)`
}

// dependenciesOf is the subquery of the dependencies of the node id expr,
// by either index: stint_dependency_task and stint_task's primary key.
// OFFSET 0 keeps each a probe of its own, as in edgesByDependency, and
// keeps the test of depends_on out of the task's probe, which the planner
// would otherwise serve by a walk of stint_task_depends_on, the index
// that holds just the rows that pass it.
func dependenciesOf(expr string) string {
	return `(SELECT e.depends_on FROM stint_dependency e WHERE e.task_id = ` + expr + ` OFFSET 0)
        UNION ALL (SELECT c.depends_on FROM (SELECT c.depends_on FROM stint_task c WHERE c.id = ` + expr + ` OFFSET 0) c
            WHERE c.depends_on IS NOT NULL)`
}
