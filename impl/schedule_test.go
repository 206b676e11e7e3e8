package impl_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

var tickKind = api.Kind[struct{}, struct{}]{ID: "test.tick"}

// tick is test.tick: it declares a schedule firing every second and
// records its runs in test_run.
type tick struct{ pool *pgxpool.Pool }

func (tick) Kind() api.Kind[struct{}, struct{}]        { return tickKind }
func (tick) TaskID(ids spi.IDs, _ struct{}) api.TaskID { return ids.Unique() }
func (tick) Schedules() []api.Schedule {
	return []api.Schedule{{Name: "every-second", Spec: "@every 1s"}}
}
func (b tick) Run(ctx context.Context, rc spi.RunContext, _ struct{}) (struct{}, error) {
	_, err := b.pool.Exec(ctx, `INSERT INTO test_run (task_id, attempt, node) VALUES ($1, $2, 'tick')`, string(rc.TaskID()), rc.Attempt())
	return struct{}{}, err
}

func withTick(pool *pgxpool.Pool) func(*impl.ServerConfig) {
	return func(cfg *impl.ServerConfig) { spi.MustRegister[struct{}, struct{}](cfg.Registry, tick{pool: pool}) }
}

// TestScheduleTicksFireOnceAcrossNodes runs a behavior's schedule on three
// nodes: every tick makes one task, which runs once.
func TestScheduleTicksFireOnceAcrossNodes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, node := range []string{"a", "b", "c"} {
		e.server(node, 5*time.Second, withTick(e.pool))
	}
	waitFor(t, time.Minute, "four ticks to run", func() bool {
		return e.count(`SELECT count(*) FROM test_run WHERE task_id LIKE 'schedule:every-second:%'`) >= 4
	})
	require.Zero(t, e.count(`SELECT count(*) FROM (SELECT task_id FROM test_run GROUP BY task_id HAVING count(*) > 1) d`),
		"a tick's task ran more than once")
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE id LIKE 'schedule:every-second:%' AND attempt > 1`))
	var last time.Time
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT last_tick FROM stint_schedule WHERE name = 'every-second'`).Scan(&last))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task WHERE id = $1`, "schedule:every-second:"+jsonInt(last.Unix())),
		"the last tick's task exists")
}

// TestScheduleCatchesUpOnceAfterDowntime leaves an hourly schedule unfired
// for a day: a node that starts fires the latest missed tick only. The
// ticks fall half an hour off the test's clock, so no new one is due while
// it runs.
func TestScheduleCatchesUpOnceAfterDowntime(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	require.NoError(t, c.AddSchedule(e.ctx, api.Schedule{Name: "hourly", Behavior: workKind.ID, Spec: "@every 1h",
		Params: json.RawMessage(`{"key":"scheduled"}`)}))
	var missed time.Time
	require.NoError(t, e.pool.QueryRow(e.ctx, `UPDATE stint_schedule
		SET last_tick = date_trunc('second', now()) - interval '24 hours 30 minutes' WHERE name = 'hourly'
		RETURNING last_tick + interval '24 hours'`).Scan(&missed))
	e.server("node", 5*time.Second)
	waitFor(t, time.Minute, "the missed tick to run", func() bool {
		return e.count(`SELECT count(*) FROM test_run WHERE task_id LIKE 'schedule:hourly:%'`) > 0
	})
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task WHERE id LIKE 'schedule:hourly:%'`), "one task for 24 missed ticks")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task WHERE id = $1`, "schedule:hourly:"+jsonInt(missed.Unix())),
		"the latest missed tick fired")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_run WHERE task_id LIKE 'schedule:hourly:%'`), "it ran once")
}

// TestSchedulesAddListRemove adds, lists and removes a schedule from a
// client-only process, and refuses bad ones without storing anything.
func TestSchedulesAddListRemove(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	good := api.Schedule{Name: "nightly", Behavior: workKind.ID, Spec: "30 2 * * *", TimeZone: "America/New_York",
		Params: json.RawMessage(`{"key":"nightly"}`)}
	require.NoError(t, c.AddSchedule(e.ctx, good))
	list, err := c.Schedules(e.ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "nightly", list[0].Name)
	require.False(t, list[0].Registered)
	require.Nil(t, list[0].LastTick)
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	next := list[0].NextTick.In(ny)
	require.Equal(t, []int{2, 30}, []int{next.Hour(), next.Minute()})
	require.True(t, next.After(list[0].CreatedAt))

	for _, bad := range []api.Schedule{
		{Name: "x", Behavior: "no.such.behavior", Spec: "@hourly"},
		{Name: "x", Behavior: workKind.ID, Spec: "@hourly", Params: json.RawMessage(`{"key":`)},
		{Name: "x", Behavior: workKind.ID, Spec: "@hourly", Params: json.RawMessage(`{"unknown":1}`)},
		{Name: "X", Behavior: workKind.ID, Spec: "@hourly"},
		{Name: "x", Behavior: workKind.ID, Spec: "every hour"},
	} {
		require.ErrorIs(t, c.AddSchedule(e.ctx, bad), api.ErrInvalid, "%+v", bad)
	}
	require.ErrorIs(t, c.RemoveSchedule(e.ctx, "Bad Name"), api.ErrInvalid)
	list, err = c.Schedules(e.ctx)
	require.NoError(t, err)
	require.Len(t, list, 1, "refused schedules stored nothing")

	require.NoError(t, c.RemoveSchedule(e.ctx, "nightly"))
	require.ErrorIs(t, c.RemoveSchedule(e.ctx, "nightly"), api.ErrNotFound)
}

// TestRegisteredScheduleNameIsTheBehaviors checks that a runtime schedule
// cannot take the name of one a behavior declares.
func TestRegisteredScheduleNameIsTheBehaviors(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", 5*time.Second, withTick(e.pool))
	err := srv.AddSchedule(e.ctx, api.Schedule{Name: "every-second", Behavior: workKind.ID, Spec: "@hourly", Params: json.RawMessage(`{"key":"k"}`)})
	require.ErrorIs(t, err, api.ErrConflict)
	list, err := srv.Schedules(e.ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.True(t, list[0].Registered)
	require.Equal(t, tickKind.ID, list[0].Behavior)
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }
