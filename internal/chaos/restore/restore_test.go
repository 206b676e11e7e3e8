package restore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/chaos"
	"github.com/stinthq/stint/internal/pgcluster"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
)

// StepsParams are the params of chaos.steps.
type StepsParams struct {
	N      int `json:"n"`
	Steps  int `json:"steps"`
	StepMS int `json:"step_ms"`
}

var stepsKind = api.Kind[StepsParams, string]{ID: "chaos.steps"}

// stepsCap caps chaos.steps' running tasks across the cluster, so that
// some of them wait their turn, due, when the backup is taken.
const stepsCap = 4

// steps is chaos.steps: a run records itself in chaos_run, then does the
// steps after its task's last checkpoint, each a row in chaos_step
// written in the transaction of the checkpoint (kept as a step of the
// task) that records it. A run resumed from a checkpoint repeats no step.
type steps struct {
	pool *pgxpool.Pool
	node string
}

func (steps) Kind() api.Kind[StepsParams, string]          { return stepsKind }
func (steps) TaskID(ids spi.IDs, p StepsParams) api.TaskID { return ids.Deterministic(p.N) }
func (steps) Policy() spi.Policy {
	return spi.Policy{Lease: chaos.Lease, MaxAttempts: 1000, BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		KeepSteps: true, ClusterConcurrency: stepsCap}
}

func (s steps) Run(ctx context.Context, rc spi.RunContext, p StepsParams) (string, error) {
	if _, err := chaos.RecordRun(ctx, s.pool, rc, s.node); err != nil {
		return "", err
	}
	var done int
	if _, err := rc.Progress(&done); err != nil {
		return "", err
	}
	for step := done + 1; step <= p.Steps; step++ {
		select {
		case <-ctx.Done():
			return "", context.Cause(ctx)
		case <-time.After(time.Duration(p.StepMS) * time.Millisecond):
		}
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO chaos_step (task_id, step, node, at) VALUES ($1, $2, $3, clock_timestamp())`,
				string(rc.TaskID()), step, s.node); err != nil {
				return err
			}
			return rc.CheckpointTx(ctx, tx, step)
		})
		if err != nil {
			return "", api.Retryable("step", "step %d: %v", step, err)
		}
	}
	return "done", nil
}

// FlakyParams are the params of chaos.flaky: Fail is "once" (the first
// run fails, the retry succeeds) or "always" (it fails for good).
type FlakyParams struct {
	N    int    `json:"n"`
	Fail string `json:"fail" validate:"oneof=once always"`
}

var flakyKind = api.Kind[FlakyParams, string]{ID: "chaos.flaky"}

// retryAfter is chaos.flaky's backoff: long enough that a task whose
// first run failed still waits for its retry when the backup is taken.
const retryAfter = 15 * time.Second

// flaky is chaos.flaky: a run records itself in chaos_run and fails as
// its params say.
type flaky struct {
	pool *pgxpool.Pool
	node string
}

func (flaky) Kind() api.Kind[FlakyParams, string]          { return flakyKind }
func (flaky) TaskID(ids spi.IDs, p FlakyParams) api.TaskID { return ids.Deterministic(p.N) }
func (flaky) Policy() spi.Policy {
	return spi.Policy{Lease: chaos.Lease, MaxAttempts: 3, BackoffMin: retryAfter, BackoffMax: retryAfter}
}

func (f flaky) Run(ctx context.Context, rc spi.RunContext, p FlakyParams) (string, error) {
	if _, err := chaos.RecordRun(ctx, f.pool, rc, f.node); err != nil {
		return "", err
	}
	switch {
	case p.Fail == "always":
		return "", api.Permanent("flaky", "fails for good")
	case p.Fail == "once" && rc.Attempt() == 1:
		return "", api.Retryable("flaky", "fails once")
	}
	return "ok", nil
}

// The restore's timing.
const (
	// downtime is how long after the backup's end the new nodes start:
	// past the 10 s after which the ticks a schedule missed fire once, as
	// the latest of them, as they would after a restore that took
	// minutes.
	downtime = 12 * time.Second
	// delay is that of the tasks submitted as the backup begins, still
	// delayed when the new nodes start, and of those held before they
	// were due (a release makes a task due when it was).
	delay = downtime + 3*time.Second
	// takeoverRoom is the room the takeover bound (a lease after the
	// first new node started) gets on a loaded machine.
	takeoverRoom = 5 * time.Second
)

// row is a task as the restored database holds it before its new nodes
// start.
type row struct {
	behavior, status string
	progress         string
	due              *time.Time
}

// ended reports whether the task had ended for good.
func (r row) ended() bool { return (r.status == "success" || r.status == "failure") && r.due == nil }

// retrying reports whether the task waited for a retry.
func (r row) retrying() bool { return r.status == "failure" && r.due != nil }

// workload is what submitEveryState submitted besides the load.
type workload struct {
	held, delayed []api.TaskID
	wf            api.WorkflowSubmission
}

// TestRestoreFromABaseBackup takes a base backup of a database whose
// tasks are in every state while two nodes work, loses the old nodes and
// the old server, restores the backup into a fresh cluster, starts new
// nodes on it, and checks what docs/operating.md says a restore promises
// against the client's ledger: every task acknowledged before the
// backup's end point is there and ends; exactly the tasks running at the
// backup run again, from their checkpoints, and within a lease of the
// new nodes' start; the schedule fires the ticks it missed once; the
// workflow completes in order.
func TestRestoreFromABaseBackup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	primary := chaos.Server(t, ctx)
	old := chaos.NewClusterAt(t, primary.DSN("stint"))
	old.Nodes = old.Nodes[:2]
	createTables(t, old)
	old.StartAll()

	// The load: chaos.work tasks, 100 a second, acknowledged in the
	// ledger with the WAL position after each acknowledgement.
	l := chaos.NewLedger()
	stop := make(chan struct{})
	loaded := make(chan struct{})
	go func() { defer close(loaded); old.Load(l, 0, stop) }()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop) // a failure: the load ends with the test
		}
	}()
	w := workload{wf: submitEveryState(t, ctx, old, l)}
	awaitEveryState(t, old, l, w.wf)
	w.delayed, w.held = submitWaiting(t, ctx, old, l)
	awaitSteppingEarly(t, old)

	dir := pgtest.TempDir(t)
	began := time.Now()
	endText, err := primary.BaseBackup(ctx, dir)
	require.NoError(t, err)
	took := time.Since(began)
	end, err := chaos.ParseLSN(endText)
	require.NoError(t, err)
	backedUp := time.Now()
	// The old cluster goes on after the backup a while: what it
	// acknowledges and fires then is not in the backup.
	acked := len(l.Acked())
	require.Eventually(t, func() bool { return len(l.Acked()) >= acked+40 }, time.Minute, 20*time.Millisecond, "the load should go on")
	close(stop)
	<-loaded
	oldTicks := ticks(t, old)
	// The old nodes and the old server are gone.
	for _, n := range old.Nodes {
		old.Sigkill(n)
	}
	require.NoError(t, primary.Kill())

	restored, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { _ = restored.Stop() })
	c := chaos.NewClusterAt(t, restored.DSN("stint"))
	c.Nodes = c.Nodes[:2]
	for i, n := range c.Nodes {
		n.Name = fmt.Sprint("new-", i)
	}
	before := snapshot(t, c)
	requireEveryState(t, before, w, backedUp)
	time.Sleep(time.Until(backedUp.Add(downtime))) // the restore's downtime: a parameter of the test
	var gone time.Time
	var goneErr error
	taken := make(chan struct{})
	go func() { defer close(taken); gone, goneErr = leasesGone(c) }()
	c.StartAll()
	<-taken
	require.NoError(t, goneErr)
	takeover := gone.Sub(firstNodeStart(t, c))
	for _, id := range w.held {
		require.NoError(t, c.Client.Release(ctx, id))
	}
	awaitEnds(t, c)

	// Every task acknowledged before the end point is there and ended.
	var beforeEnd, afterEnd, afterEndMissing int
	var lost []api.TaskID
	for _, id := range l.Acked() {
		_, ok := before[id]
		switch {
		case l.LSN[id] <= end:
			beforeEnd++
			if !ok {
				lost = append(lost, id)
			}
		default:
			afterEnd++
			if !ok {
				afterEndMissing++
			}
		}
	}
	require.Empty(t, lost, "tasks acknowledged before the backup's end point %s that the restored database lacks", endText)
	require.Positive(t, afterEndMissing, "tasks acknowledged after the backup's end point should not be in it")
	after := snapshot(t, c)
	for id, r := range before {
		require.True(t, after[id].ended(), "task %s (%s at the backup) did not end", id, r.status)
		if r.ended() {
			require.Equal(t, r.status, after[id].status, "task %s had ended before the backup", id)
		}
	}

	// Exactly the tasks running at the backup run again (and those
	// waiting for a retry retry), each from its checkpoint; the dead
	// nodes' leases are taken over within a lease of the first new node's
	// start. Workflow nodes record no runs: their effects are checked
	// with their workflow.
	oldRuns, newRuns := runs(t, c, "node-"), runs(t, c, "new-")
	var rerun, retried int
	for id, r := range before {
		if !slices.Contains(recording, r.behavior) {
			continue
		}
		_, ranBefore := oldRuns[id]
		_, ranAfter := newRuns[id]
		switch {
		case r.status == "running":
			require.True(t, ranAfter, "task %s (%s) was running at the backup and did not run again", id, r.behavior)
			rerun++
		case r.ended():
			require.False(t, ranAfter, "task %s had ended (%s) at the backup and ran again", id, r.status)
		case ranBefore && ranAfter:
			retried++ // waiting for a retry, or given back by a run cut off
		}
	}
	require.Positive(t, rerun, "tasks should have been running at the backup")
	require.Less(t, takeover, chaos.Lease+takeoverRoom, "the dead nodes' leases should be taken over within a lease of the new nodes' start")
	kept, repeated := checkSteps(t, c, before)

	fired, catchUp, duplicateTicks := checkSchedule(t, c, before, oldTicks)
	checkWorkflow(t, c, w.wf)

	t.Logf("measured: restore from a base backup (pg_basebackup took %s, end point %s; the new nodes started %s after it): "+
		"acknowledged=%d (before the end point %d, after it %d of which %d not in the backup) lost=%d; "+
		"running at the backup and rerun=%d (their %d checkpointed steps kept, %d repeated; the dead nodes' leases taken over %s after the first new node started); "+
		"waiting for a retry and retried=%d; schedule: %d ticks after the restore, %d of them for the downtime, duplicate ticks=%d; "+
		"workflow %s: %d of its %d nodes done at the backup, completed in order",
		took.Round(time.Millisecond), endText, downtime, len(l.Acked()), beforeEnd, afterEnd, afterEndMissing, len(lost),
		rerun, kept, repeated, takeover.Round(time.Millisecond), retried, fired, catchUp, duplicateTicks,
		w.wf.ID, doneNodes(before, w.wf), len(w.wf.Nodes))
	require.Zero(t, repeated, "steps repeated after the restore")
	require.LessOrEqual(t, catchUp, 1, "the ticks missed during the downtime should fire once, as the latest")
	require.Zero(t, duplicateTicks, "ticks the old cluster fired after the backup's end point fired again")
}

// createTables creates chaos_step and chaos_effect.
func createTables(t *testing.T, c *chaos.Cluster) {
	_, err := c.Pool.Exec(c.Ctx, `CREATE TABLE chaos_step (task_id text NOT NULL, step int NOT NULL, node text NOT NULL, at timestamptz NOT NULL)`)
	require.NoError(t, err)
	chaos.CreateEffects(t, c.Ctx, c.Pool)
}

// Ranges of the params' N, one a kind of task, apart from the load's.
const (
	nSteps   = 1_000_000
	nFlaky   = 2_000_000
	nWaiting = 3_000_000
	nTick    = 5_000_000
)

// tickSchedule fires a chaos.work task every second.
const tickSchedule = "restore-tick"

// submitEveryState submits, beside the load, the tasks that reach the
// other states before the backup and records them in l: chaos.steps tasks
// (running with steps checkpointed, or due and waiting for their cap),
// chaos.flaky tasks that fail once (waiting for a retry at the backup) or
// for good, and a workflow, which it returns; and it adds a schedule.
func submitEveryState(t *testing.T, ctx context.Context, c *chaos.Cluster, l *chaos.Ledger) api.WorkflowSubmission {
	var reqs []api.SubmitRequest
	for i := range 24 {
		reqs = append(reqs, api.SubmitRequest{Behavior: stepsKind.ID, Params: fmt.Appendf(nil, `{"n":%d,"steps":8,"step_ms":250}`, nSteps+i)})
	}
	for i, fail := range []string{"once", "once", "once", "once", "always", "always", "always"} {
		reqs = append(reqs, api.SubmitRequest{Behavior: flakyKind.ID, Params: fmt.Appendf(nil, `{"n":%d,"fail":%q}`, nFlaky+i, fail)})
	}
	submit(t, ctx, c, l, reqs)
	require.NoError(t, c.Client.AddSchedule(ctx, api.Schedule{Name: tickSchedule, Behavior: chaos.WorkKind.ID, Spec: "@every 1s",
		Params: fmt.Appendf(nil, `{"n":%d}`, nTick)}))

	// A workflow of twelve nodes in nine levels, a second each: partway
	// when the backup is taken.
	req := api.WorkflowRequest{ID: "wf-restore"}
	for i := range 12 {
		n := api.WorkflowNode{Name: fmt.Sprint("n", i),
			Task: api.SubmitRequest{Behavior: chaos.NodeKind.ID, Params: fmt.Appendf(nil, `{"n":%d,"sleep_ms":1000}`, 6_000_000+i)}}
		switch i {
		case 0:
		case 1, 2, 3:
			n.DependsOn = []string{"n0"}
		case 4:
			n.DependsOn = []string{"n1", "n2", "n3"}
		default:
			n.DependsOn = []string{fmt.Sprint("n", i-1)}
		}
		req.Nodes = append(req.Nodes, n)
	}
	wf, err := c.Client.SubmitWorkflow(ctx, req)
	require.NoError(t, err)
	ids := []api.TaskID{wf.ID}
	for _, id := range wf.Nodes {
		ids = append(ids, id)
	}
	c.Acknowledged(ctx, l, ids...)
	return wf
}

// submitWaiting submits chaos.work tasks that wait past the backup, when
// it is about to be taken, and records them in l: delayed ones, and held
// ones, which it holds.
func submitWaiting(t *testing.T, ctx context.Context, c *chaos.Cluster, l *chaos.Ledger) (delayed, held []api.TaskID) {
	var reqs []api.SubmitRequest
	for i := range 13 {
		reqs = append(reqs, api.SubmitRequest{Behavior: chaos.WorkKind.ID, Params: fmt.Appendf(nil, `{"n":%d}`, nWaiting+i), Delay: delay})
	}
	ids := submit(t, ctx, c, l, reqs)
	delayed, held = ids[:10], ids[10:]
	for _, id := range held {
		require.NoError(t, c.Client.Hold(ctx, id))
	}
	return delayed, held
}

// submit submits reqs and records them in l.
func submit(t *testing.T, ctx context.Context, c *chaos.Cluster, l *chaos.Ledger, reqs []api.SubmitRequest) []api.TaskID {
	subs, err := c.Client.SubmitMany(ctx, reqs)
	require.NoError(t, err)
	ids := make([]api.TaskID, len(subs))
	for i, s := range subs {
		ids[i] = s.ID
	}
	c.Acknowledged(ctx, l, ids...)
	return ids
}

// everyState is the query of the states the backup should catch: the
// tasks failed for good, those waiting for a retry, the chaos.steps tasks
// running past a checkpoint, and the workflow's nodes done.
const everyState = `SELECT
	count(*) FILTER (WHERE behavior = 'chaos.flaky' AND status = 'failure' AND schedule_not_before IS NULL),
	count(*) FILTER (WHERE behavior = 'chaos.flaky' AND status = 'failure' AND schedule_not_before IS NOT NULL),
	count(*) FILTER (WHERE behavior = 'chaos.steps' AND status = 'running' AND progress IS NOT NULL),
	count(*) FILTER (WHERE id = ANY($1) AND status = 'success')
	FROM stint_task`

// awaitEveryState waits up to a minute until the tasks are in every
// state: some failed for good, some wait for a retry, a chaos.steps task
// runs past a checkpoint, the workflow has two nodes done and the load
// 200 tasks acknowledged.
func awaitEveryState(t *testing.T, c *chaos.Cluster, l *chaos.Ledger, wf api.WorkflowSubmission) {
	var failed, retrying, stepping, done int
	for deadline := time.Now().Add(time.Minute); ; {
		require.NoError(t, c.Pool.QueryRow(c.Ctx, everyState, nodeIDs(wf)).Scan(&failed, &retrying, &stepping, &done))
		if failed == 3 && retrying == 4 && stepping > 0 && done >= 2 && len(l.Acked()) >= 200 {
			return
		}
		require.True(t, time.Now().Before(deadline), "the tasks did not reach every state: failed=%d retrying=%d stepping=%d nodes done=%d acknowledged=%d",
			failed, retrying, stepping, done, len(l.Acked()))
		time.Sleep(50 * time.Millisecond) // polling the database for the states, bounded by the deadline
	}
}

// awaitSteppingEarly waits up to a minute until a chaos.steps task runs
// with at most half its steps checkpointed, a second or more before it
// ends, so that it still runs with checkpointed steps when the backup
// that follows ends. The capped steps tasks start and end together: at
// some moments none has a checkpoint, at others all are about to end.
func awaitSteppingEarly(t *testing.T, c *chaos.Cluster) {
	for deadline := time.Now().Add(time.Minute); ; {
		if count(t, c, `SELECT count(*) FROM stint_task WHERE behavior = 'chaos.steps' AND status = 'running'
			AND CASE WHEN jsonb_typeof(progress) = 'number' THEN (progress #>> '{}')::numeric END BETWEEN 1 AND 4`) > 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "no chaos.steps task ran with its first steps checkpointed")
		time.Sleep(20 * time.Millisecond) // polling the database, bounded by the deadline
	}
}

// requireEveryState checks that the database restored from a backup
// that ended at backedUp holds tasks in every state.
func requireEveryState(t *testing.T, before map[api.TaskID]row, w workload, backedUp time.Time) {
	states := map[string]int{}
	for _, r := range before {
		switch {
		case r.retrying():
			states["waiting for a retry"]++
		case r.status == "scheduled" && r.due.After(backedUp):
			states["delayed"]++
		case r.status == "scheduled":
			states["scheduled"]++
		case r.status == "running" && r.behavior == string(stepsKind.ID) && r.progress != "":
			states["running with checkpointed steps"]++
		default:
			states[r.status]++
		}
	}
	for _, s := range []string{"scheduled", "delayed", "running", "running with checkpointed steps", "waiting for a retry", "held", "failure", "success"} {
		require.Positive(t, states[s], "no task was %s at the backup: %v", s, states)
	}
	for _, id := range w.held {
		require.Equal(t, "held", before[id].status, "task %s", id)
	}
	for _, id := range w.delayed {
		require.Equal(t, "scheduled", before[id].status, "task %s", id)
	}
	done := doneNodes(before, w.wf)
	require.True(t, done > 0 && done < len(w.wf.Nodes), "the workflow should be partway at the backup: %d of %d nodes done", done, len(w.wf.Nodes))
}

// snapshot returns every task of c's database.
func snapshot(t *testing.T, c *chaos.Cluster) map[api.TaskID]row {
	rows, err := c.Pool.Query(c.Ctx, `SELECT id, behavior, status, coalesce(progress::text, ''), schedule_not_before FROM stint_task`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[api.TaskID]row{}
	for rows.Next() {
		var id string
		var r row
		require.NoError(t, rows.Scan(&id, &r.behavior, &r.status, &r.progress, &r.due))
		out[api.TaskID(id)] = r
	}
	require.NoError(t, rows.Err())
	return out
}

// awaitEnds waits while tasks keep ending (a minute with none ending
// fails the test) until every task the database held before the new nodes
// started has ended.
func awaitEnds(t *testing.T, c *chaos.Cluster) {
	const open = `FROM stint_task WHERE NOT (status IN ('success', 'failure') AND schedule_not_before IS NULL) AND created_at < $1`
	started := c.Clock()
	left, progressed := count(t, c, `SELECT count(*) `+open, started), time.Now()
	for left > 0 {
		if time.Since(progressed) > time.Minute {
			rows, err := c.Pool.Query(c.Ctx, `SELECT format('%s %s %s due %s', id, behavior, status, schedule_not_before) `+open+` LIMIT 10`, started)
			require.NoError(t, err)
			tasks, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			require.Fail(t, "tasks did not end", "%d tasks, among them: %s", left, strings.Join(tasks, "; "))
		}
		time.Sleep(100 * time.Millisecond) // polling the database for the ends, bounded by the progress deadline
		if n := count(t, c, `SELECT count(*) `+open, started); n < left {
			left, progressed = n, time.Now()
		}
	}
}

// recording are the behaviors whose runs record themselves in chaos_run.
var recording = []string{string(chaos.WorkKind.ID), string(stepsKind.ID), string(flakyKind.ID)}

// leasesGone waits up to a minute until the database holds no lease of
// the old nodes and returns its clock then, or the error that ended the
// wait.
func leasesGone(c *chaos.Cluster) (time.Time, error) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		var left int
		var at time.Time
		err := c.Pool.QueryRow(c.Ctx, `SELECT count(*), clock_timestamp() FROM stint_lease WHERE starts_with(node, 'node-')`).Scan(&left, &at)
		if err != nil || left == 0 {
			return at, err
		}
		time.Sleep(20 * time.Millisecond) // polling for the takeover, bounded by the deadline
	}
	return time.Time{}, errors.New("the old nodes' leases were not taken over within a minute")
}

// firstNodeStart returns when the first new node started.
func firstNodeStart(t *testing.T, c *chaos.Cluster) time.Time {
	var at time.Time
	require.NoError(t, c.Pool.QueryRow(c.Ctx, `SELECT min(started_at) FROM stint_node WHERE starts_with(id, 'new-')`).Scan(&at))
	return at
}

// runs returns, per task, the start of its first run on the nodes whose
// names begin with prefix.
func runs(t *testing.T, c *chaos.Cluster, prefix string) map[api.TaskID]time.Time {
	rows, err := c.Pool.Query(c.Ctx, `SELECT task_id, min(started) FROM chaos_run WHERE starts_with(node, $1) GROUP BY task_id`, prefix)
	require.NoError(t, err)
	defer rows.Close()
	out := map[api.TaskID]time.Time{}
	for rows.Next() {
		var id string
		var at time.Time
		require.NoError(t, rows.Scan(&id, &at))
		out[api.TaskID(id)] = at
	}
	require.NoError(t, rows.Err())
	return out
}

// checkSteps checks that every chaos.steps task did each of its steps
// once, and that those running at the backup resumed after their
// checkpoint; it returns how many steps the backup kept of them and how
// many were done twice.
func checkSteps(t *testing.T, c *chaos.Cluster, before map[api.TaskID]row) (kept, repeated int) {
	repeated = count(t, c, `SELECT count(*) FROM (SELECT 1 FROM chaos_step GROUP BY task_id, step HAVING count(*) > 1) x`)
	for id, r := range before {
		if r.behavior != string(stepsKind.ID) {
			continue
		}
		require.Equal(t, 8, count(t, c, `SELECT count(DISTINCT step) FROM chaos_step WHERE task_id = $1`, string(id)), "steps of %s", id)
		if r.status != "running" || r.progress == "" {
			continue
		}
		var checkpoint int
		require.NoError(t, json.Unmarshal([]byte(r.progress), &checkpoint))
		kept += checkpoint
		require.Equal(t, checkpoint+1, count(t, c, `SELECT coalesce(min(step), 9) FROM chaos_step WHERE task_id = $1 AND starts_with(node, 'new-')`, string(id)),
			"task %s should resume after its checkpoint, step %d", id, checkpoint)
	}
	return kept, repeated
}

// ticks returns the ids of the schedule's ticks in c's database.
func ticks(t *testing.T, c *chaos.Cluster) []string {
	rows, err := c.Pool.Query(c.Ctx, `SELECT id FROM stint_task WHERE starts_with(id, $1)`, "schedule:"+tickSchedule+":")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}

// checkSchedule checks that the schedule fired before the backup and
// after the restore, and returns the ticks fired since the restore, how
// many of them were for times before the first new node started (the
// downtime's), and how many the old cluster had fired too (after the
// backup's end point, or it would be in the backup): fired twice.
func checkSchedule(t *testing.T, c *chaos.Cluster, before map[api.TaskID]row, oldTicks []string) (fired, catchUp, duplicates int) {
	first := firstNodeStart(t, c).Truncate(time.Second)
	var backedUp int
	for _, id := range ticks(t, c) {
		if _, ok := before[api.TaskID(id)]; ok {
			backedUp++
			continue
		}
		fired++
		unix, err := strconv.ParseInt(id[strings.LastIndex(id, ":")+1:], 10, 64)
		require.NoError(t, err, id)
		if time.Unix(unix, 0).Before(first) {
			catchUp++
		}
		if slices.Contains(oldTicks, id) {
			duplicates++
		}
	}
	require.Positive(t, backedUp, "the schedule should have fired before the backup")
	require.Positive(t, fired-catchUp, "the schedule should fire after the restore")
	return fired, catchUp, duplicates
}

// checkWorkflow checks that the workflow succeeded, each node's effect
// written once and after its dependencies'.
func checkWorkflow(t *testing.T, c *chaos.Cluster, wf api.WorkflowSubmission) {
	got, err := c.Client.GetWorkflow(c.Ctx, wf.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowSucceeded, got.State, "workflow %s: %+v", wf.ID, got.Counts)
	ids := nodeIDs(wf)
	require.Equal(t, len(ids), count(t, c, `SELECT count(DISTINCT task_id) FROM chaos_effect WHERE task_id = ANY($1)`, ids), "nodes with an effect")
	require.Equal(t, len(ids), count(t, c, `SELECT count(*) FROM chaos_effect WHERE task_id = ANY($1)`, ids), "nodes' effects, each once")
	require.Zero(t, count(t, c, `SELECT count(*) FROM `+chaos.AllEdges+` e
		JOIN chaos_effect dep ON dep.task_id = e.depends_on
		JOIN chaos_effect node ON node.task_id = e.task_id
		WHERE node.at <= dep.at`), "nodes whose effect came before a dependency's")
}

// nodeIDs returns the task ids of wf's nodes.
func nodeIDs(wf api.WorkflowSubmission) []string {
	var ids []string
	for _, id := range wf.Nodes {
		ids = append(ids, string(id))
	}
	slices.Sort(ids)
	return ids
}

// doneNodes counts wf's nodes that had succeeded in before.
func doneNodes(before map[api.TaskID]row, wf api.WorkflowSubmission) int {
	n := 0
	for _, id := range wf.Nodes {
		if before[id].status == "success" {
			n++
		}
	}
	return n
}

// count runs a query that counts.
func count(t *testing.T, c *chaos.Cluster, q string, args ...any) int {
	var n int
	require.NoError(t, c.Pool.QueryRow(c.Ctx, q, args...).Scan(&n))
	return n
}
