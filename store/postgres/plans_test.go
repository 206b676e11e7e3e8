package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
)

// hotStatement is a statement of the hot path, with the arguments it is
// explained with on the filled tables of planFill, and the settings
// statement its transaction runs first: seqscanOffSQL unless given, none
// with plain.
type hotStatement struct {
	name     string
	sql      string
	settings string
	plain    bool
	args     []any
}

// planLease is the lease of the running tasks run-000000 to run-000999
// in planFill.
var planLease = pgtype.UUID{Bytes: [16]byte{15: 0}, Valid: true}

// hotStatements lists every statement of the hot path: submits (plain,
// sharing, of new ids, starting on the submitting node, debounced; SubmitTx runs the same ones
// in the caller's transaction), claims (plain and capped per group),
// claims under flow control, renewals, checkpoints, finishes of each outcome, takeovers, lease
// releases, an await's poll and a subscription's poll.
func hotStatements() []hotStatement {
	var submitted, started submitColumns
	for i := range 5000 {
		t := store.NewTask{ID: api.TaskID(fmt.Sprintf("new-%06d", i)), Behavior: "bench.noop", Priority: 5}
		if i%10 == 0 {
			t.GroupKey = fmt.Sprintf("g%d", i%100)
		}
		submitted.add(t, false)
		t.StartLease = time.Minute
		started.add(t, true)
	}
	// 20 diamonds of 4 nodes, as concurrent SubmitWorkflows send them.
	diamonds := make([]store.NewWorkflow, 20)
	for i := range diamonds {
		id := api.TaskID(fmt.Sprintf("wf-new-%03d", i))
		w := store.NewWorkflow{Task: store.NewTask{ID: id, Behavior: api.WorkflowBehavior, Params: []byte(`{}`)},
			Names: []string{"a", "b", "c", "d"}, DependsOn: [][]int{nil, {0}, {0}, {1, 2}}}
		for _, name := range w.Names {
			w.Nodes = append(w.Nodes, store.NewTask{ID: id + "/" + api.TaskID(name), Behavior: "bench.noop", Params: []byte(`{}`), ParentID: id})
			w.Rules = append(w.Rules, api.RuleAllSucceeded)
		}
		diamonds[i] = w
	}
	debouncedOne := newSubmitColumns(1, false)
	debouncedOne.add(store.NewTask{ID: "due-000001", Behavior: "bench.noop", Priority: 5, Delay: time.Minute}, false)
	ids, leases := make(textArray, 1000), make(uuidArray, 1000)
	durs, again, noAgain := make(intArray, 1000), make(intArray, 1000), make(intArray, 1000)
	results, errs, nulls := make(nullTextArray, 1000), make(nullTextArray, 1000), make(nullTextArray, 1000)
	waits, noWaits := make(boolArray, 1000), make(boolArray, 1000)
	success, failure, snooze := make(textArray, 1000), make(textArray, 1000), make(textArray, 1000)
	hints := make([]pgtype.TID, 1000)
	noTopics, topics, seqs := make(textArray, 1000), make(textArray, 1000), make(intArray, 1000)
	payloads, signalKeys := make(textArray, 1000), make(nullTextArray, 1000)
	for i := range ids {
		topics[i], seqs[i] = "approval", int64(i+1)
		payloads[i], signalKeys[i] = `{}`, pgtype.Text{String: fmt.Sprintf("key-%d", i), Valid: i%2 == 0}
		ids[i], leases[i], durs[i] = fmt.Sprintf("run-%06d", i), planLease, time.Minute.Microseconds()
		success[i], failure[i], snooze[i] = "success", "failure", "scheduled"
		results[i], errs[i] = jsonText([]byte(`{}`)), jsonText([]byte(`{"message":"x"}`))
		again[i], noAgain[i], waits[i] = time.Second.Microseconds(), -1, true
		hints[i] = pgtype.TID{BlockNumber: uint32(i / 100), OffsetNumber: uint16(i%100 + 1), Valid: true}
	}
	node, behaviors, leaseUS := "n", []string{"bench.noop"}, []int64{time.Minute.Microseconds()}
	// The store statement of signals runs after the lock statement, which
	// keeps the ids it locked in a setting; finished tasks' signals
	// reopen them.
	signalLockedSettings := seqscanOffSQL + `, set_config('` + signalLockedSetting + `', '{` + strings.Join(ids, ",") + `}', true)`
	done, reopen := make(textArray, 1000), textArray(behaviors)
	for i := range done {
		done[i] = fmt.Sprintf("done-%06d", i)
	}
	doneLockedSettings := seqscanOffSQL + `, set_config('` + signalLockedSetting + `', '{` + strings.Join(done, ",") + `}', true)`
	stmts := []hotStatement{
		{name: "submit", sql: submitSQL, args: append(submitted.args(), false, true, submitted.rateUses, submitted.versions)},
		{name: "submit in a transaction", sql: submitSQL, settings: seqscanSaveOffSQL, args: append(submitted.args(), false, true, submitted.rateUses, submitted.versions)},
		{name: "submit sharing", sql: shareSQL, args: append(submitted.args(), true, submitted.rateUses, submitted.versions)},
		{name: "submit sharing: the tasks left as they were", sql: sharedSQL, args: []any{ids}},
		{name: "submit combining: lock", sql: combineLockSQL, args: []any{"due-000001", "b1"}},
		{name: "submit debounced", sql: debounceSQL, args: append(debouncedOne.args(), true, debouncedOne.rateUses, debouncedOne.versions, intArray{time.Hour.Microseconds()})},
		{name: "submit starting", sql: submitStartSQL, settings: genericSettingsSQL, args: append(started.args(), false, true, started.startLeases, node, started.rateUses, started.versions)},
		{name: "submit sharing starting", sql: shareStartSQL, settings: genericSettingsSQL, args: append(started.args(), true, started.startLeases, node, started.rateUses, started.versions)},
		{name: "submit with new ids", sql: newSQL, args: append(submitted.args(), true, submitted.rateUses, submitted.versions)},
		{name: "submit with new ids starting", sql: newStartSQL, settings: genericSettingsSQL, args: append(started.args(), true, started.startLeases, node, started.rateUses, started.versions)},
		{name: "submit workflows", sql: workflowSubmitSQL, settings: genericSettingsSQL, args: workflowSubmitArgs(diamonds, true)},
		{name: "submit workflows: what holds the ids not stored", sql: workflowsTakenSQL, args: []any{textArray{"wf-000001", "wf-new-000"}}},
		{name: "claim", sql: claimSQL, settings: claimSettingsSQL, args: []any{node, behaviors, leaseUS, 1000, int64(0), uuidArray(nil)}},
		{name: "claim handed over in a finish", sql: claimSkipSQL, settings: handOverSettingsSQL, args: []any{node, behaviors, leaseUS, 8, int64(0), uuidArray{planLease}}},
		{name: "claim under flow control: window", sql: flowWindowSQL, settings: flowSettingsSQL,
			args: []any{"bench.noop", int64(0), 4000, []string{"g1"}, hints[:10]}},
		{name: "claim under flow control: keys in turn", sql: flowKeysSQL, settings: flowSettingsSQL,
			args: []any{"bench.noop", int64(0), 64, []string{"g1"}, hints[:10], "g0", 32}},
		{name: "claim under flow control: keys with room", sql: flowRoomSQL, settings: flowSettingsSQL,
			args: []any{"bench.noop", int64(0), 4, []string{"g1"}, hints[:10], "g0", 1000, `{"g2": 1}`, 128}},
		{name: "claim under flow control: running counts", sql: runningSQL, settings: flowSettingsSQL,
			args: []any{"bench.noop", ids[:10], leases[:10]}},
		{name: "claim under flow control: behaviors with due tasks", sql: dueBehaviorsSQL,
			args: []any{behaviors, int64(0)}},
		{name: "claim under flow control: turn", sql: flowLockSQL, settings: flowSettingsSQL,
			args: []any{"bench.noop", int64(0)}},
		{name: "claim under flow control: rate keys", sql: rateKeysSQL, settings: flowSettingsSQL,
			args: []any{[]string{"plan.limit"}, []string{""}}},
		{name: "claim under flow control: running bound", sql: leaseBoundSQL, settings: flowSettingsSQL,
			args: []any{"bench.noop"}},
		{name: "claim under flow control: at once", sql: flowTakeSQL, settings: flowSettingsSQL,
			args: []any{node, behaviors, leaseUS, 1000, int64(0), uuidArray(nil)}},
		{name: "claim under flow control: at once, guarded", sql: flowTakeGuardedSQL, settings: flowSettingsSQL,
			args: []any{node, behaviors, leaseUS, 1000, int64(0), uuidArray(nil), 100000}},
		{name: "claim under flow control: stale hints", sql: dropHintsSQL, settings: flowSettingsSQL, args: []any{hints[:10]}},
		{name: "claim under flow control: held back", sql: flowMoveSQL, settings: flowSettingsSQL,
			args: []any{hints[:10], ids[:10], `{"run-000001": 1000}`, `{"run-000001": {"reason": "rate_limit"}}`}},
		{name: "claim under flow control: claim", sql: claimHintsSQL, settings: flowSettingsSQL,
			args: []any{node, behaviors, leaseUS, hints, int64(0), uuidArray(nil)}},
		{name: "rate limit changed: free its waiting tasks", sql: freeRateWaitersSQL, settings: seqscanSaveOffSQL, args: []any{"plan.limit", "stint_due"}},
		{name: "renew", sql: renewSQL, args: []any{ids, leases, durs}},
		{name: "checkpoint", sql: checkpointSQL, args: []any{"run-000001", planLease, `{"done":1}`, false, []int64{}}},
		{name: "checkpoint keeping a step", sql: checkpointSQL, args: []any{"run-000001", planLease, `{"done":1}`, true, []int64{1, 2}}},
		{name: "finish: success", sql: finishSQL, args: []any{ids, leases, success, results, nulls, noAgain, noWaits, textArray{}, intArray{}, noTopics}},
		{name: "finish: failure, retried", sql: finishSQL, args: []any{ids, leases, failure, nulls, errs, again, noWaits, textArray{}, intArray{}, noTopics}},
		{name: "finish: snooze", sql: finishSQL, args: []any{ids, leases, snooze, nulls, nulls, again, noWaits, textArray{}, intArray{}, noTopics}},
		{name: "finish: wait for children", sql: finishSQL, args: []any{ids, leases, success, results, nulls, again, waits, textArray{}, intArray{}, noTopics}},
		{name: "finish: sleep on a signal", sql: finishSQL, args: []any{ids, leases, snooze, nulls, nulls, again, noWaits, ids, seqs, topics}},
		{name: "finish: wake who slept on a signal that came", sql: signalWakeSQL, args: []any{ids}},
		{name: "signal: lock", sql: signalLockSQL, args: []any{ids, textArray{}}},
		{name: "signal: lock, passing over the rows others hold", sql: signalTryLockSQL, args: []any{ids, reopen}},
		{name: "signal", sql: signalSQL, settings: signalLockedSettings, args: []any{ids, topics, payloads, signalKeys, false, textArray{}}},
		{name: "signal many, all or none", sql: signalSQL, settings: signalLockedSettings, args: []any{ids, topics, payloads, signalKeys, true, reopen}},
		{name: "signal reopening finished tasks", sql: signalSQL, settings: doneLockedSettings, args: []any{done, topics, payloads, signalKeys, false, reopen}},
		{name: "receive", sql: receiveSQL, args: []any{"run-000001", "approval", int64(0)}},
		{name: "finish: children ended", sql: childrenEndedSQL, args: []any{ids}},
		{name: "workflow growth: the ancestors of nodes", sql: ancestorEdgesSQL, args: []any{ids[:10]}},
		{name: "workflow graph: its edges", sql: workflowEdgesOfSQL, args: []any{"due-000001", "due-000002"}},
		{name: "finish: dependents woken or skipped", sql: depsEndedSQL, settings: probesSaveOffSQL, args: []any{ids, node, []string{}, []int64{}, 0, ids}},
		{name: "finish: dependents woken, started here", sql: depsEndedSQL, settings: probesSaveOffSQL, args: []any{ids, node, behaviors, leaseUS, 100, []string{}}},
		{name: "read a waiting workflow node", sql: getTaskSQL, args: []any{"wait-000001"}},
		{name: "list workflows", sql: listWorkflowsSQL, args: []any{"", "", 101}},
		{name: "list workflows: failed ones", sql: listWorkflowsSQL, args: []any{"wf-000100", string(api.WorkflowFailed), 101}},
		{name: "unclaim", sql: unclaimSQL, args: []any{ids, leases, false, int64(0)}},
		{name: "takeover", sql: takeoverSQL, args: []any{100}},
		{name: "release leases", sql: releaseLeasesSQL, args: []any{leases[:1]}},
		{name: "await: read", sql: getTaskSQL, args: []any{"run-000001"}},
		{name: "get: the failed runs", sql: attemptsSQL, args: []any{"run-000001"}},
		{name: "await: mark awaited", sql: markAwaitedSQL, args: []any{"due-000001"}},
		{name: "subscription: tick", sql: feedTickSQL, plain: true},
		{name: "subscription: cursor", sql: tickExistsSQL, plain: true, args: []any{int64(1)}},
		{name: "subscription: ticks", sql: nextTicksSQL, plain: true, args: []any{int64(1)}},
		{name: "subscription: changes", sql: readChangesSQL, args: []any{int64(1), int64(2), "", "", "", ""}},
	}
	for i := range stmts {
		if stmts[i].settings == "" && !stmts[i].plain {
			stmts[i].settings = seqscanOffSQL
		}
	}
	return stmts
}

// planFill fills the tables the hot statements read with 100,000 tasks:
// 40,000 due (with claim hints; every tenth in one of 10 group keys),
// 40,000 running (1,000 of them under planLease, as one claim's, the
// others under a lease each, as one-task claims'), 20,000
// finished; 20,000 workflow nodes waiting, each for two of the running
// tasks; 1,000 workflows' own tasks; a failed first run of each running
// task; and 100,000 changes in the feed between ticks 1 and 2.
const planFill = `
INSERT INTO stint_task (id, behavior, status, priority, schedule_not_before, group_key)
SELECT 'due-' || lpad(i::text, 6, '0'), 'bench.noop', 'scheduled', 5, now() - interval '1 minute',
    CASE WHEN i % 10 = 0 THEN 'g' || (i % 100) END
FROM generate_series(0, 39999) i;
INSERT INTO stint_due (id, behavior, priority, due, group_key)
SELECT id, behavior, priority, schedule_not_before, group_key FROM stint_task;
INSERT INTO stint_task (id, behavior, status, priority, schedule_not_before, lease, node, attempt, executed_at,
    lost_not_before, group_key, parent_id)
SELECT 'run-' || lpad(i::text, 6, '0'), 'bench.noop', 'running', 5, now() - interval '1 minute',
    ('00000000-0000-0000-0000-' || lpad(CASE WHEN i < 1000 THEN 0 ELSE i END::text, 12, '0'))::uuid,
    'n', 1, now(), now() + interval '1 minute',
    CASE WHEN i % 10 = 0 THEN 'g' || (i % 100) END, CASE WHEN i % 2 = 0 THEN 'due-' || lpad((i / 2)::text, 6, '0') END
FROM generate_series(0, 39999) i;
INSERT INTO stint_lease (lease, node, expires_at, task_ids)
SELECT ('00000000-0000-0000-0000-' || lpad(l::text, 12, '0'))::uuid, 'n', now() + interval '1 minute',
    CASE WHEN l = 0 THEN ARRAY(SELECT 'run-' || lpad(j::text, 6, '0') FROM generate_series(0, 999) j)
    ELSE ARRAY['run-' || lpad(l::text, 6, '0')] END
FROM (SELECT 0 UNION ALL SELECT generate_series(1000, 39999)) AS s(l);
INSERT INTO stint_task (id, behavior, status, priority, result, attempt, executed_at, finished_at)
SELECT 'done-' || lpad(i::text, 6, '0'), 'bench.noop', 'success', 5, '{}', 1, now(), now()
FROM generate_series(0, 19999) i;
INSERT INTO stint_task (id, behavior, status, priority, parent_id, workflow_node, dep_rule, deps_pending,
    deps_succeeded, deps_failed, deps_skipped)
SELECT 'wait-' || lpad(i::text, 6, '0'), 'bench.noop', 'waiting', 5, 'wf', 'n' || i, 'all_succeeded', 2, 0, 0, 0
FROM generate_series(0, 19999) i;
INSERT INTO stint_dependency (depends_on, task_id)
SELECT 'run-' || lpad((i % 40000)::text, 6, '0'), 'wait-' || lpad((i / 2)::text, 6, '0')
FROM generate_series(0, 39999) i;
INSERT INTO stint_task (id, behavior, status, priority, waiting_children, children_pending, deps_pending)
SELECT 'wf-' || lpad(i::text, 6, '0'), 'stint.workflow', 'waiting', 5, true, 20, 0
FROM generate_series(0, 999) i;
INSERT INTO stint_attempt (task_id, attempt, node, ended_at)
SELECT 'run-' || lpad(i::text, 6, '0'), 1, 'n', now() FROM generate_series(0, 39999) i;
INSERT INTO stint_feed_tick (snap) VALUES (pg_current_snapshot());
INSERT INTO stint_change (task_ids, behaviors, statuses, parent_ids, finals)
SELECT ARRAY['due-' || i], ARRAY['bench.noop'], ARRAY['scheduled'], ARRAY[NULL::text], ARRAY[false]
FROM generate_series(0, 99999) i;
INSERT INTO stint_feed_tick (snap) VALUES (pg_current_snapshot())`

// planTables are the tables whose scans must be index-driven, and the
// indexes that may drive them: a task by its id (or a group's tasks by
// their key, the tasks a rate limit holds back by the limit, or a node's
// dependents of one dependency by it), claim hints by behavior in pickup order (a claim's walk,
// cut short by its limit), a lease by its token or its expiry (a
// takeover's walk, cut short by its limit), changes by transaction.
var planTables = map[string][]string{
	"stint_task":       {"stint_task_pkey", "stint_task_group", "stint_task_waiting", "stint_task_workflow", "stint_task_depends_on"},
	"stint_due":        {"stint_due_order", "stint_due_key"},
	"stint_lease":      {"stint_lease_pkey", "stint_lease_expiry", "stint_lease_behavior"},
	"stint_change":     {"stint_change_xid"},
	"stint_dependency": {"stint_dependency_pkey", "stint_dependency_task"},
	"stint_attempt":    {"stint_attempt_pkey"},
	"stint_step":       {"stint_step_pkey"},
	"stint_signal":     {"stint_signal_pkey", "stint_signal_pending", "stint_signal_key"},
}

// planSmallCTEs are the CTEs of hot statements that a nested loop may read
// again for each row: they hold a row per behavior of the statement (cfg),
// one row (wake, woke, notified), or at most a takeover's limit of leases
// (kept).
var planSmallCTEs = []string{"cfg", "wake", "woke", "notified", "kept"}

// Every hot statement reads the tasks, claim hints, leases and changes
// it needs through an index, whatever the statistics say, so that its cost
// does not grow with the tables. Each statement is prepared on a
// connection as pgx prepares it (a named statement of the extended
// protocol) and explained with its settings while the tables are empty,
// which makes the generic plan the connection keeps, as a first execution
// would; then the tables are filled with 100,000 tasks, and each statement
// is explained on the same connection, with that cached generic plan and
// with a custom plan made then (as the exec and simple protocol modes plan
// every statement). The tables are never analyzed in one case, and
// analyzed while empty in the other (a queue that drained and was
// analyzed meets the next burst). Only plan shapes are checked: no
// sequential scan of those tables, no index scan of them without an index
// condition (a walk of the whole index), no other index than the ones that
// serve the hot path, and no nested loop that reads a CTE of the
// statement's input again for each row (quadratic in the input).
func TestHotStatementsStayIndexDriven(t *testing.T) {
	t.Parallel()
	for _, analyzed := range []bool{false, true} {
		t.Run(fmt.Sprintf("analyzed_empty=%v", analyzed), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			st, err := Open(ctx, pgtest.New(t), MaxConns(1))
			require.NoError(t, err)
			defer st.Close()
			pc, err := st.pool.Acquire(ctx)
			require.NoError(t, err)
			defer pc.Release()
			conn := pc.Conn()
			for table := range planTables {
				// An analyze (autovacuum's) would make the plans anew.
				_, err := conn.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`)
				require.NoError(t, err)
				if analyzed {
					_, err = conn.Exec(ctx, `ANALYZE `+table)
					require.NoError(t, err)
				}
			}
			stmts := hotStatements()
			types := make([][]string, len(stmts))
			executes := make([]string, len(stmts))
			for i, s := range stmts {
				sd, err := conn.Prepare(ctx, planName(i), s.sql)
				require.NoError(t, err, s.name)
				for _, oid := range sd.ParamOIDs {
					var typ string
					require.NoError(t, conn.QueryRow(ctx, `SELECT format_type($1, NULL)`, oid).Scan(&typ))
					types[i] = append(types[i], typ)
				}
				require.Len(t, types[i], len(s.args), s.name)
				executes[i] = "EXECUTE " + planName(i)
				if len(s.args) > 0 {
					lits := make([]string, len(s.args))
					for j, a := range s.args {
						lits[j] = sqlLiteral(t, ctx, conn, a, types[i][j])
					}
					executes[i] += "(" + strings.Join(lits, ", ") + ")"
				}
				// The generic plan, made now and kept by the connection.
				inTx(t, ctx, conn, s.settings, "force_generic_plan", func(tx pgx.Tx) {
					_, err := tx.Exec(ctx, "EXPLAIN "+executes[i])
					require.NoError(t, err, s.name)
				})
			}
			_, err = conn.Exec(ctx, planFill)
			require.NoError(t, err)
			for i, s := range stmts {
				execute := executes[i]
				for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
					var p string
					inTx(t, ctx, conn, s.settings, mode, func(tx pgx.Tx) {
						require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+execute).Scan(&p))
					})
					if os.Getenv("STINT_PLANS") != "" {
						fmt.Printf("==== %s (%s, analyzed empty: %v)\n%s\n", s.name, mode, analyzed, textPlan(t, ctx, conn, s.settings, mode, execute))
					}
					if bad := planDefects(t, p); len(bad) > 0 {
						t.Errorf("%s (%s): %s\n%s", s.name, mode, strings.Join(bad, "; "), textPlan(t, ctx, conn, s.settings, mode, execute))
					}
				}
			}
		})
	}
}

func planName(i int) string { return fmt.Sprintf("stint_plan_%d", i) }

// inTx runs fn in a transaction of conn that runs settings first, plans
// prepared statements in the plan cache mode given, and is rolled back.
func inTx(t *testing.T, ctx context.Context, conn *pgx.Conn, settings, mode string, fn func(pgx.Tx)) {
	t.Helper()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // nothing is kept
	if settings != "" {
		_, err = tx.Exec(ctx, settings)
		require.NoError(t, err)
	}
	_, err = tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, mode)
	require.NoError(t, err)
	fn(tx)
}

// sqlLiteral returns v as an SQL literal of the type typ, as the server
// prints it.
func sqlLiteral(t *testing.T, ctx context.Context, conn *pgx.Conn, v any, typ string) string {
	t.Helper()
	var text *string
	require.NoError(t, conn.QueryRow(ctx, `SELECT ($1::`+typ+`)::text`, v).Scan(&text))
	if text == nil {
		return "NULL::" + typ
	}
	return "'" + strings.ReplaceAll(*text, "'", "''") + "'::" + typ
}

// textPlan returns the plan of execute in text, for a failure's message.
func textPlan(t *testing.T, ctx context.Context, conn *pgx.Conn, settings, mode, execute string) string {
	t.Helper()
	var lines []string
	inTx(t, ctx, conn, settings, mode, func(tx pgx.Tx) {
		rows, err := tx.Query(ctx, "EXPLAIN "+execute)
		require.NoError(t, err)
		lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
	})
	return strings.Join(lines, "\n")
}

// planNode is a node of a plan in EXPLAIN's JSON format.
type planNode struct {
	NodeType  string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	Alias     string     `json:"Alias"`
	Index     string     `json:"Index Name"`
	IndexCond string     `json:"Index Cond"`
	CTE       string     `json:"CTE Name"`
	Parent    string     `json:"Parent Relationship"`
	Plans     []planNode `json:"Plans"`
}

// planDefects returns the scans of planTables in the plan p (EXPLAIN's
// JSON) that are not driven by one of their indexes with a condition, and
// the nested loops that read a CTE not in planSmallCTEs for each row.
func planDefects(t *testing.T, p string) []string {
	t.Helper()
	var top []struct{ Plan planNode }
	require.NoError(t, json.Unmarshal([]byte(p), &top))
	require.Len(t, top, 1)
	var bad []string
	var walk func(n planNode)
	walk = func(n planNode) {
		if indexes, ok := planTables[n.Relation]; ok {
			where := n.NodeType + " on " + n.Relation + " " + n.Alias
			switch n.NodeType {
			case "Seq Scan":
				bad = append(bad, where)
			case "Index Scan", "Index Only Scan":
				switch {
				case n.IndexCond == "":
					bad = append(bad, where+" using "+n.Index+" without an index condition")
				case !slices.Contains(indexes, n.Index):
					bad = append(bad, where+" using "+n.Index)
				}
			case "Bitmap Heap Scan":
				for _, c := range n.Plans {
					switch {
					case c.NodeType != "Bitmap Index Scan":
					case !slices.Contains(indexes, c.Index):
						bad = append(bad, where+" using "+c.Index)
					case c.IndexCond == "":
						bad = append(bad, where+" using "+c.Index+" without an index condition")
					}
				}
			}
		}
		if n.NodeType == "Nested Loop" {
			for _, c := range n.Plans {
				if c.Parent == "Inner" && c.NodeType == "CTE Scan" && !slices.Contains(planSmallCTEs, c.CTE) {
					bad = append(bad, "Nested Loop over a CTE Scan of "+c.CTE+", read again for each outer row")
				}

			}
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(top[0].Plan)
	return bad
}
