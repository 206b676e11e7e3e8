package migrations_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/migrations"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// upgradeParams are the params of upgrade.work.
type upgradeParams struct {
	Key string `json:"key"`
}

// upgradeResult is what upgrade.work returns: the run's attempt and the
// progress it found.
type upgradeResult struct {
	Key      string          `json:"key"`
	Attempt  int             `json:"attempt"`
	Progress json.RawMessage `json:"progress,omitempty"`
}

// upgradeWork is upgrade.work, the behavior of the tasks an earlier
// release left.
type upgradeWork struct{}

func (upgradeWork) Kind() api.Kind[upgradeParams, upgradeResult] {
	return api.Kind[upgradeParams, upgradeResult]{ID: "upgrade.work"}
}

func (upgradeWork) TaskID(ids spi.IDs, p upgradeParams) api.TaskID { return ids.Deterministic(p.Key) }

func (upgradeWork) Run(_ context.Context, rc spi.RunContext, p upgradeParams) (upgradeResult, error) {
	var progress json.RawMessage
	if _, err := rc.Progress(&progress); err != nil {
		return upgradeResult{}, err
	}
	return upgradeResult{Key: p.Key, Attempt: rc.Attempt(), Progress: progress}, nil
}

// fixture is a task in one state, as a release wrote it: SQL expressions
// for its columns. A column the release's schema lacks is left out; a
// fixture whose state needs a column the schema lacks (needs) is skipped.
type fixture struct {
	id    string
	cols  map[string]string
	needs []string
}

// fixtures holds a task in every state a release may leave: due, delayed,
// running on a dead node (lease expired) and on a live one, finished for
// good either way, failed and due for a retry, held, in a held group, and a
// parent waiting for its child.
var fixtures = []fixture{
	{id: "due", cols: map[string]string{"status": "'scheduled'", "priority": "3", "schedule_not_before": "now() - interval '1 second'",
		"group_key": "'g-open'", "trace": "'00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'"}},
	{id: "later", cols: map[string]string{"status": "'scheduled'", "schedule_not_before": "now() + interval '1 hour'"}},
	{id: "lost", cols: map[string]string{"status": "'running'", "node": "'gone'", "lease": "gen_random_uuid()", "attempt": "1",
		"executed_at": "now() - interval '2 minutes'", "lost_not_before": "now() - interval '1 minute'",
		"schedule_not_before": "now() - interval '1 minute'", "progress": `'{"step": 1}'`}},
	{id: "live", cols: map[string]string{"status": "'running'", "node": "'elsewhere'", "lease": "gen_random_uuid()", "attempt": "1",
		"executed_at": "now()", "lost_not_before": "now() + interval '1 hour'", "schedule_not_before": "now() + interval '1 hour'",
		"resubmit": "true"}},
	{id: "done", cols: map[string]string{"status": "'success'", "result": `'{"key": "done", "attempt": 1}'`, "attempt": "1",
		"executed_at": "now() - interval '1 minute'", "finished_at": "now()"}},
	{id: "failed", cols: map[string]string{"status": "'failure'", "error": `'{"retryable": false, "message": "boom"}'`, "attempt": "1",
		"errors": "1", "executed_at": "now() - interval '1 minute'", "finished_at": "now()"}},
	{id: "retry", cols: map[string]string{"status": "'failure'", "error": `'{"retryable": true, "message": "try again"}'`, "attempt": "1",
		"errors": "1", "executed_at": "now() - interval '1 minute'", "finished_at": "now()", "schedule_not_before": "now() - interval '1 second'"}},
	{id: "held", cols: map[string]string{"status": "'held'"}},
	{id: "in-held-group", cols: map[string]string{"status": "'scheduled'", "schedule_not_before": "now() - interval '1 second'", "group_key": "'g-held'"}},
	{id: "parent", cols: map[string]string{"status": "'scheduled'", "schedule_not_before": "now() + interval '1 hour'", "attempt": "1",
		"children_pending": "1", "waiting_children": "true"}, needs: []string{"children_pending", "waiting_children"}},
	{id: "child", cols: map[string]string{"status": "'scheduled'", "schedule_not_before": "now() - interval '1 second'", "parent_id": "'parent'"},
		needs: []string{"children_pending"}},
}

// TestUpgradeFromEveryLevelKeepsTasks builds, at each earlier level of the
// core line, a database with a task in every state that level's schema
// holds, written as that level's code wrote it; migrates it to the newest
// level; and finds every task unchanged, column by column, and runnable by
// a server of the newest code: due tasks run, a task of a dead node is
// taken over once its lease expired, and resumes from its checkpoint, a
// retry runs, a released task or group runs, a child's end wakes its
// parent; the others keep their state.
func TestUpgradeFromEveryLevelKeepsTasks(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	require.NoError(t, err)
	var levels []int
	for _, m := range all {
		if m.Line == migrations.CoreLine {
			levels = append(levels, m.Version)
		}
	}
	require.NotEmpty(t, levels)
	for _, level := range levels[:len(levels)-1] {
		t.Run(fmt.Sprintf("from_%04d", level), func(t *testing.T) {
			t.Parallel()
			upgradeFrom(t, level)
		})
	}
}

func upgradeFrom(t *testing.T, level int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn := pgtest.New(t)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	// The clone is migrated: empty it, then build the level's schema.
	_, err = conn.Exec(ctx, `DROP SCHEMA public CASCADE; CREATE SCHEMA public`)
	require.NoError(t, err)
	require.NoError(t, migrations.UpTo(ctx, conn, level))

	columns := tableColumns(t, ctx, conn, "stint_task")
	ids := writeFixtures(t, ctx, conn, columns)
	before := snapshot(t, ctx, conn, columns)
	require.Len(t, before, len(ids))

	require.NoError(t, migrations.Up(ctx, conn))
	require.Equal(t, before, snapshot(t, ctx, conn, columns), "the migrations changed a task")

	st, err := postgres.Open(ctx, dsn)
	require.NoError(t, err)
	defer st.Close()
	reg := spi.NewRegistry()
	spi.MustRegister[upgradeParams, upgradeResult](reg, upgradeWork{})
	srv, err := impl.NewServer(st, impl.ServerConfig{Node: "new", Registry: reg,
		PollInterval: 100 * time.Millisecond, AwaitPollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, srv.Start(ctx))
	defer func() {
		stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Stop(stop)
	}()

	require.NoError(t, srv.Release(ctx, "held"))
	require.NoError(t, srv.ReleaseGroup(ctx, "g-held"))
	ran := map[string]upgradeResult{}
	for _, id := range []string{"due", "lost", "retry", "held", "in-held-group", "child", "parent"} {
		if !slices.Contains(ids, id) {
			continue
		}
		task, err := srv.Await(ctx, api.TaskID(id))
		require.NoError(t, err, "task %s", id)
		require.Equal(t, api.StatusSuccess, task.Status, "task %s: %+v", id, task)
		var res upgradeResult
		require.NoError(t, json.Unmarshal(task.Result, &res))
		ran[id] = res
	}
	require.Equal(t, 1, ran["due"].Attempt)
	require.Equal(t, 2, ran["lost"].Attempt, "the task of the dead node was taken over")
	require.JSONEq(t, `{"step": 1}`, string(ran["lost"].Progress), "the takeover resumed from the checkpoint")
	require.Equal(t, 2, ran["retry"].Attempt)

	for id, want := range map[string]api.Status{"later": api.StatusScheduled, "live": api.StatusRunning,
		"done": api.StatusSuccess, "failed": api.StatusFailure} {
		task, err := srv.Get(ctx, api.TaskID(id))
		require.NoError(t, err, "task %s", id)
		require.Equal(t, want, task.Status, "task %s", id)
	}
	after := snapshot(t, ctx, conn, columns)
	for _, id := range []string{"later", "live", "done", "failed"} {
		require.Equal(t, before[id], after[id], "task %s changed", id)
	}
}

// tableColumns returns the columns of table in the database's schema.
func tableColumns(t *testing.T, ctx context.Context, conn *pgx.Conn, table string) []string {
	t.Helper()
	rows, err := conn.Query(ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position`, table)
	require.NoError(t, err)
	columns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return columns
}

// writeFixtures writes the fixtures the schema of columns can hold, as the
// code of its level wrote them: the task rows, and from the level that has
// them, a claim hint per due task (parked in a held group, from the level
// that parks) and a lease row per running task. It returns their ids.
func writeFixtures(t *testing.T, ctx context.Context, conn *pgx.Conn, columns []string) []string {
	t.Helper()
	var ids []string
	for _, f := range fixtures {
		if !containsAll(columns, f.needs) {
			continue
		}
		names := []string{"id", "behavior", "params"}
		values := []string{"'" + f.id + "'", "'upgrade.work'", fmt.Sprintf(`'{"key": %q}'`, f.id)}
		for c, v := range f.cols {
			if slices.Contains(columns, c) {
				names, values = append(names, c), append(values, v)
			}
		}
		_, err := conn.Exec(ctx, `INSERT INTO stint_task (`+strings.Join(names, ", ")+`) VALUES (`+strings.Join(values, ", ")+`)`)
		require.NoError(t, err, "fixture %s", f.id)
		ids = append(ids, f.id)
	}
	if len(tableColumns(t, ctx, conn, "stint_hold")) > 0 {
		_, err := conn.Exec(ctx, `INSERT INTO stint_hold (group_key) VALUES ('g-held')`)
		require.NoError(t, err)
	}
	if due := tableColumns(t, ctx, conn, "stint_due"); len(due) > 0 {
		parked := ""
		if slices.Contains(due, "parked") {
			parked = ", parked"
		}
		_, err := conn.Exec(ctx, `INSERT INTO stint_due (id, behavior, priority, due, group_key`+parked+`)
			SELECT id, behavior, priority, schedule_not_before, group_key`+
			strings.Replace(parked, "parked", "EXISTS (SELECT 1 FROM stint_hold h WHERE h.group_key = t.group_key)", 1)+`
			FROM stint_task t WHERE status IN ('scheduled', 'success', 'failure') AND schedule_not_before IS NOT NULL`)
		require.NoError(t, err)
	}
	if len(tableColumns(t, ctx, conn, "stint_lease")) > 0 {
		_, err := conn.Exec(ctx, `INSERT INTO stint_lease (lease, node, expires_at, task_ids)
			SELECT lease, node, lost_not_before, ARRAY[id] FROM stint_task WHERE status = 'running'`)
		require.NoError(t, err)
	}
	return ids
}

// snapshot returns every task's columns (those of columns) by id, as JSON.
func snapshot(t *testing.T, ctx context.Context, conn *pgx.Conn, columns []string) map[string]string {
	t.Helper()
	// Simple protocol: a migration may change the statement's result
	// types, which a cached statement would refuse.
	rows, err := conn.Query(ctx, `SELECT id, row_to_json(s)::text FROM (SELECT `+strings.Join(columns, ", ")+` FROM stint_task) s`,
		pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	out := map[string]string{}
	var id, row string
	_, err = pgx.ForEachRow(rows, []any{&id, &row}, func() error { out[id] = row; return nil })
	require.NoError(t, err)
	return out
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
