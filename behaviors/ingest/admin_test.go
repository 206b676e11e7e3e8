package ingest_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/ingest"
)

// TestAdminActions walks the admin actions through the rules of FACTS §4:
// hold and release of a pending job, forced fail, requeue, and delete only
// from Held, Failed or Completed.
func TestAdminActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.server("node")
	require.NoError(t, e.admin.PauseQueue(e.ctx))
	var lines []line
	for i := range 4 {
		lines = append(lines, e.fileLine(fmt.Sprintf("o%d", i), "f.txt", "sha1", []byte(fmt.Sprintf("object %d", i))))
	}
	batch := e.submit(manifest(lines...))
	e.notClaimedFor(batch) // a paused queue acquires nothing
	require.NoError(t, e.client.Resume(e.ctx, ingest.BatchBehavior))
	waitFor(t, 20*time.Second, "the batch to spawn its jobs", func() bool {
		return e.batchView(batch).Status == ingest.BatchProcessing
	})
	j := func(i int) api.TaskID { return ingest.JobID(batch, i) }
	require.Equal(t, map[ingest.JobState]int{ingest.JobPending: 4}, e.batchView(batch).Counts)

	// Pending -> Held; Held -> Failed and Pending -> Deleted are refused
	// and change nothing; requeue needs Failed.
	require.NoError(t, e.admin.Hold(e.ctx, j(0)))
	require.Equal(t, ingest.JobHeld, e.jobView(j(0)).Status)
	require.Equal(t, api.StatusHeld, e.jobView(j(0)).TaskStatus)
	for _, err := range []error{
		e.admin.Fail(e.ctx, j(0)),
		e.admin.Delete(e.ctx, j(2)),
		e.admin.Hold(e.ctx, j(0)),
		e.admin.Release(e.ctx, j(2)),
	} {
		require.ErrorIs(t, err, api.ErrConflict)
	}
	_, err := e.admin.Requeue(e.ctx, j(2))
	require.ErrorIs(t, err, ingest.ErrIllegalTransition)
	require.ErrorIs(t, e.admin.Delete(e.ctx, batch), ingest.ErrIllegalTransition, "a processing batch is not deleted")
	require.Equal(t, ingest.JobHeld, e.jobView(j(0)).Status)
	require.Equal(t, ingest.JobPending, e.jobView(j(2)).Status)

	// Forced fail of two waiting jobs: they fail when picked up.
	require.NoError(t, e.admin.Fail(e.ctx, j(1)))
	require.NoError(t, e.admin.Fail(e.ctx, j(3)))
	require.Equal(t, ingest.JobFailed, e.jobView(j(1)).Status)
	require.NoError(t, e.client.Resume(e.ctx, ingest.JobBehavior))
	for _, i := range []int{1, 3} {
		jt := e.await(j(i))
		require.Equal(t, api.StatusFailure, jt.Status)
		require.Equal(t, "failed_by_admin", jt.Error.Code)
	}
	require.Equal(t, api.StatusSuccess, e.await(j(2)).Status)
	require.Zero(t, e.fs.count("GET", "/files/o1/f.txt"), "a failed job does no work")
	// The held job keeps the batch processing.
	e.notClaimedFor(j(0))
	bv := e.batchView(batch)
	require.Equal(t, ingest.BatchProcessing, bv.Status)
	require.Equal(t, map[ingest.JobState]int{ingest.JobHeld: 1, ingest.JobFailed: 2, ingest.JobCompleted: 1}, bv.Counts)

	// Held -> Pending: the job runs, and the batch reports Failed.
	require.NoError(t, e.admin.Release(e.ctx, j(0)))
	bt := e.await(batch)
	require.Equal(t, api.StatusFailure, bt.Status)
	require.ElementsMatch(t, []api.TaskID{j(1), j(3)}, e.batchView(batch).Report.Failed)

	// Failed -> Deleted.
	require.NoError(t, e.admin.Delete(e.ctx, j(3)))
	_, err = e.client.Get(e.ctx, j(3))
	require.ErrorIs(t, err, api.ErrNotFound)

	// A requeue shows at once: the successor of the last successful state
	// (none: Estimating) with retry_count 1. The queue is paused so that
	// nothing moves on.
	require.NoError(t, e.admin.PauseQueue(e.ctx))
	requeued, err := e.admin.Requeue(e.ctx, batch)
	require.NoError(t, err)
	require.Equal(t, []api.TaskID{j(1)}, requeued)
	v := e.jobView(j(1))
	require.Equal(t, ingest.JobEstimating, v.Status)
	require.Equal(t, 1, v.RetryCount)
	require.Equal(t, api.StatusScheduled, v.TaskStatus)
	require.NoError(t, e.admin.ResumeQueue(e.ctx))
	bt = e.await(batch)
	require.Equal(t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
	var res ingest.BatchResult
	require.NoError(t, json.Unmarshal(bt.Result, &res))
	require.ElementsMatch(t, []api.TaskID{j(0), j(1), j(2)}, res.Report.Succeeded)
	require.Equal(t, []api.TaskID{j(1)}, res.Report.Recovered)
	require.Equal(t, 1, res.Report.Deleted)

	// Completed -> deleted (the cleanup), with its jobs.
	require.NoError(t, e.admin.Delete(e.ctx, batch))
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task`))
	require.Equal(t, 3, e.count(`SELECT count(*) FROM stint_ingest_object`), "the inventory stays")
}

// TestPriorityOrdersPickup runs jobs one at a time: the batch with the
// lower priority number goes first, and ties go by creation (manifest
// order).
func TestPriorityOrdersPickup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.server("node", func(cfg *ingest.Config) { cfg.JobsPerNode = 1 })
	require.NoError(t, e.client.Pause(e.ctx, ingest.JobBehavior))
	submit := func(name string, priority int) api.TaskID {
		var lines []line
		for i := range 3 {
			lines = append(lines, e.fileLine(fmt.Sprintf("%s%d", name, i), "f", "", []byte(name)))
		}
		f, err := ingest.SubmitBatch(e.ctx, e.client, ingest.BatchParams{Submitter: "s", Profile: "coll",
			Manifest: manifest(lines...), Priority: &priority})
		require.NoError(t, err)
		return f.ID()
	}
	low := submit("low", 7)
	high := submit("high", 2)
	waitFor(t, 20*time.Second, "both batches to spawn their jobs", func() bool {
		return e.batchView(low).Status == ingest.BatchProcessing && e.batchView(high).Status == ingest.BatchProcessing
	})
	require.NoError(t, e.client.Resume(e.ctx, ingest.JobBehavior))
	e.await(low)
	e.await(high)
	var order []api.TaskID
	for _, cb := range e.fs.callbacks() {
		order = append(order, cb.JobID)
	}
	require.Equal(t, []api.TaskID{ingest.JobID(high, 0), ingest.JobID(high, 1), ingest.JobID(high, 2),
		ingest.JobID(low, 0), ingest.JobID(low, 1), ingest.JobID(low, 2)}, order)
}
