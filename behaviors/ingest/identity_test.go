package ingest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/ingest"
	"github.com/stinthq/stint/spi"
)

// TestLocalIDLookup: an object deposited again under its local id gets the
// identifier stored for it (a new version of the same object); a manifest
// that gives another identifier for that local id fails the job and stores
// nothing; the same local id in another profile is another object.
func TestLocalIDLookup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.server("node")
	deposit := func(profile, ident string, data string) (api.Task, api.TaskID) {
		t.Helper()
		l := e.fileLine("loc1", "a.txt", "sha256", []byte(data))
		l.ident = ident
		f, err := ingest.SubmitBatch(e.ctx, e.client, ingest.BatchParams{Submitter: "tester", Profile: profile, Manifest: manifest(l)})
		require.NoError(t, err)
		return e.await(f.ID()), ingest.JobID(f.ID(), 0)
	}

	first, job1 := deposit("coll", "", "version one")
	require.Equal(t, api.StatusSuccess, first.Status, "batch error: %v", first.Error)
	p1 := e.jobProgress(job1)
	require.True(t, p1.Minted)
	require.Equal(t, 1, p1.Version)
	require.Equal(t, int32(1), e.mints.Load())

	second, job2 := deposit("coll", "", "version two")
	require.Equal(t, api.StatusSuccess, second.Status, "batch error: %v", second.Error)
	p2 := e.jobProgress(job2)
	require.Equal(t, p1.Identifier, p2.Identifier, "the local id's identifier is reused")
	require.True(t, p2.Reused)
	require.False(t, p2.Minted)
	require.Equal(t, 2, p2.Version)
	require.Equal(t, int32(1), e.mints.Load(), "nothing minted the second time")

	// The manifest names another identifier for the local id: the job
	// fails in processing and nothing is stored for it.
	other := "ark:/99999/fk4notthesame"
	bad, job3 := deposit("coll", other, "version three")
	require.Equal(t, api.StatusFailure, bad.Status)
	v := e.jobView(job3)
	require.Equal(t, ingest.JobFailed, v.Status)
	require.Equal(t, "loc1", v.LocalID)
	p3 := e.jobProgress(job3)
	require.Equal(t, "local_id_mismatch", p3.ErrorCode)
	require.Equal(t, ingest.JobProcessing, p3.FailedStage)
	require.Contains(t, p3.Error, p1.Identifier)
	require.Contains(t, p3.Error, other)
	require.Empty(t, p3.Identifier)
	require.Equal(t, 0, e.count(`SELECT count(*) FROM stint_ingest_object WHERE identifier = $1`, other))
	require.Equal(t, 2, e.count(`SELECT count(*) FROM stint_ingest_object WHERE local_id = 'loc1'`))

	// The stored identifier given explicitly is fine.
	same, job4 := deposit("coll", p1.Identifier, "version four")
	require.Equal(t, api.StatusSuccess, same.Status, "batch error: %v", same.Error)
	require.Equal(t, 3, e.jobProgress(job4).Version)

	// Another profile's loc1 is another object.
	elsewhere, job5 := deposit("other", "", "elsewhere")
	require.Equal(t, api.StatusSuccess, elsewhere.Status, "batch error: %v", elsewhere.Error)
	p5 := e.jobProgress(job5)
	require.NotEqual(t, p1.Identifier, p5.Identifier)
	require.True(t, p5.Minted)
	require.Equal(t, 1, p5.Version)
}

// TestLargeJobPriority: estimating lowers the priority of a job whose
// payload is LargeJobBytes or more, which then waits in provisioning at
// that priority; a small job, and a large one whose priority is lower
// already, keep theirs.
func TestLargeJobPriority(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.free.Store(0) // every job waits in provisioning
	e.server("node", func(cfg *ingest.Config) { cfg.LargeJobBytes, cfg.LargeJobPriority = 1000, 12 })
	large := e.fileLine("big", "a.bin", "", content("big", 1500))
	small := e.fileLine("small", "b.bin", "", content("small", 10))
	batch := e.submit(manifest(large, small))
	low := 20
	f, err := ingest.SubmitBatch(e.ctx, e.client, ingest.BatchParams{Submitter: "tester", Profile: "coll",
		Manifest: manifest(e.fileLine("big2", "c.bin", "", content("big2", 2000))), Priority: &low})
	require.NoError(t, err)
	jobs := []api.TaskID{ingest.JobID(batch, 0), ingest.JobID(batch, 1), ingest.JobID(f.ID(), 0)}
	waitFor(t, 30*time.Second, "the jobs to wait in provisioning", func() bool {
		for _, j := range jobs {
			if !e.jobIn(j, ingest.JobProvisioning) {
				return false
			}
		}
		return true
	})
	require.Equal(t, 12, e.jobView(jobs[0]).Priority, "the large job is lowered")
	require.EqualValues(t, 1500, e.jobProgress(jobs[0]).SpaceNeeded)
	require.Equal(t, spi.DefaultPriority, e.jobView(jobs[1]).Priority, "the small job keeps its priority")
	require.Equal(t, 20, e.jobView(jobs[2]).Priority, "a lower priority is kept")

	e.free.Store(-1)
	for _, b := range []api.TaskID{batch, f.ID()} {
		bt := e.await(b)
		require.Equal(t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
	}
	require.Equal(t, 12, e.jobView(jobs[0]).Priority)
}

// TestLargeJobSettings: a priority outside 0..32767 is refused at
// registration; a negative size turns the rule off.
func TestLargeJobSettings(t *testing.T) {
	t.Parallel()
	for _, prio := range []int{-1, 32768} {
		cfg := ingest.Config{WorkDir: t.TempDir(), StorageDir: t.TempDir(), LargeJobPriority: prio,
			OpenPool: func(context.Context) (*pgxpool.Pool, error) { return nil, errors.New("not opened") }}
		err := ingest.Register(spi.NewRegistry(), cfg)
		require.ErrorContains(t, err, "LargeJobPriority")
	}

	e := newEnv(t)
	e.free.Store(0)
	e.server("node", func(cfg *ingest.Config) { cfg.LargeJobBytes = -1 })
	batch := e.submit(manifest(e.fileLine("big", "a.bin", "", content("big", 5000))))
	job := ingest.JobID(batch, 0)
	waitFor(t, 30*time.Second, "the job to wait in provisioning", func() bool {
		return e.jobIn(job, ingest.JobProvisioning)
	})
	require.Equal(t, spi.DefaultPriority, e.jobView(job).Priority)
}

// jobIn reports whether job exists and is in state.
func (e *tenv) jobIn(job api.TaskID, state ingest.JobState) bool {
	v, err := e.admin.Job(e.ctx, job)
	return err == nil && v.Status == state
}
