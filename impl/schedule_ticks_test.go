package impl_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// firedTicks returns the ticks schedule name fired, as Unix seconds, in
// order: the ticks of its tasks' ids.
func (e *env) firedTicks(name string) []int64 {
	e.t.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT split_part(id, ':', 3)::bigint FROM stint_task WHERE id LIKE 'schedule:' || $1 || ':%' ORDER BY 1`, name)
	require.NoError(e.t, err)
	var out []int64
	for rows.Next() {
		var tick int64
		require.NoError(e.t, rows.Scan(&tick))
		out = append(out, tick)
	}
	require.NoError(e.t, rows.Err())
	return out
}

// addEverySecond adds schedules of test.work firing every second.
func (e *env) addEverySecond(names ...string) {
	e.t.Helper()
	c := e.client()
	for _, name := range names {
		require.NoError(e.t, c.AddSchedule(e.ctx, api.Schedule{Name: name, Behavior: workKind.ID, Spec: "@every 1s",
			Params: json.RawMessage(`{"key":"` + name + `"}`)}))
	}
}

// requireEveryTick fails the test unless ticks are consecutive seconds.
func requireEveryTick(t *testing.T, name string, ticks []int64) {
	t.Helper()
	for i := 1; i < len(ticks); i++ {
		require.Equal(t, ticks[i-1]+1, ticks[i], "schedule %s skipped ticks between %d and %d: fired %v", name, ticks[i-1], ticks[i], ticks)
	}
}

// A node that is up fires every tick of an @every 1s schedule: none is
// skipped for two falling due at one look.
func TestScheduleFiresEveryTickWhileUp(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.addEverySecond("steady")
	e.server("node", 5*time.Second)
	waitFor(t, time.Minute, "30 ticks to fire", func() bool {
		return len(e.firedTicks("steady")) >= 30
	})
	requireEveryTick(t, "steady", e.firedTicks("steady"))
}

// A schedule held by a node stopped inside its firing (here the test's
// transaction) keeps no node from firing the other schedules, and once it
// is let go every tick it missed meanwhile fires, each: the node was up.
func TestScheduleHeldByAStoppedNodeBlocksNoOne(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.addEverySecond("free", "held") // the node looks at free first, by name
	e.server("node", 5*time.Second)
	waitFor(t, time.Minute, "both schedules to fire", func() bool {
		return len(e.firedTicks("free")) >= 1 && len(e.firedTicks("held")) >= 1
	})

	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(e.ctx) }()
	_, err = tx.Exec(e.ctx, `SELECT 1 FROM stint_schedule WHERE name = 'held' FOR UPDATE`)
	require.NoError(t, err)
	heldAt := len(e.firedTicks("held"))
	free := len(e.firedTicks("free"))
	waitFor(t, time.Minute, "the free schedule to fire 4 ticks while the other is held", func() bool {
		return len(e.firedTicks("free")) >= free+4
	})
	require.LessOrEqual(t, len(e.firedTicks("held")), heldAt+1, "the held schedule fired while held")
	require.NoError(t, tx.Commit(e.ctx))

	// The ticks held back fire once it is let go, each.
	last := e.firedTicks("free")
	waitFor(t, time.Minute, "the held schedule to catch up", func() bool {
		held := e.firedTicks("held")
		return len(held) > 0 && held[len(held)-1] >= last[len(last)-1]
	})
	requireEveryTick(t, "held", e.firedTicks("held"))
	requireEveryTick(t, "free", e.firedTicks("free"))
}
