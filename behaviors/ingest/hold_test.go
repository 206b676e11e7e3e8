package ingest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/ingest"
	"github.com/stinthq/stint/internal/childtest"
)

// notClaimedFor checks, for a while, that none of ids is claimed. It is
// the check of an absence, so it has to watch for some time: 300 ms is
// six claim polls of the test nodes.
func (e *tenv) notClaimedFor(ids ...api.TaskID) {
	e.t.Helper()
	require.Never(e.t, func() bool {
		for _, id := range ids {
			t, err := e.client.Get(e.ctx, id)
			if err != nil || t.Attempt > 0 || t.Status == api.StatusRunning {
				return true
			}
		}
		return false
	}, 300*time.Millisecond, 20*time.Millisecond, "a held or paused task was claimed")
}

func TestCollectionHold(t *testing.T) {
	t.Parallel()

	t.Run("before the batch", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.server("node")
		require.NoError(t, e.admin.HoldCollection(e.ctx, "coll"))
		batch := e.submit(manifest(e.fileLine("o1", "a", "md5", []byte("a")), e.fileLine("o2", "b", "", []byte("b"))))
		e.notClaimedFor(batch)
		bv := e.batchView(batch)
		require.Equal(t, ingest.BatchHeld, bv.Status, "a pending batch of a held collection shows Held")
		require.True(t, bv.CollectionHeld)
		held, err := e.admin.HeldCollections(e.ctx)
		require.NoError(t, err)
		require.Equal(t, []string{"coll"}, held)

		require.NoError(t, e.admin.ReleaseCollection(e.ctx, "coll"))
		bt := e.await(batch)
		require.Equal(t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
		bv = e.batchView(batch)
		require.Equal(t, ingest.BatchCompleted, bv.Status)
		require.Equal(t, map[ingest.JobState]int{ingest.JobCompleted: 2}, bv.Counts)
	})

	t.Run("during the batch", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		// One job of the collection at a time, and the first one's
		// download waits at the gate.
		e.server("node", func(cfg *ingest.Config) { cfg.JobsPerCollection = 1 })
		lines := []line{e.fileLine("o1", "a", "sha1", []byte("first")), e.fileLine("o2", "b", "", []byte("second")),
			e.fileLine("o3", "c", "sha256", []byte("third"))}
		started, open := e.fs.gate("/files/o1/a")
		defer open()
		batch := e.submit(manifest(lines...))
		select {
		case <-started:
		case <-time.After(20 * time.Second):
			t.Fatal("the first job did not start downloading")
		}
		require.NoError(t, e.admin.HoldCollection(e.ctx, "coll"))
		open()
		j0, j1, j2 := ingest.JobID(batch, 0), ingest.JobID(batch, 1), ingest.JobID(batch, 2)
		// The running job runs on; the others are not picked up.
		waitFor(t, 20*time.Second, "the running job to complete", func() bool {
			return e.jobView(j0).Status == ingest.JobCompleted
		})
		e.notClaimedFor(j1, j2)
		bv := e.batchView(batch)
		require.Equal(t, ingest.BatchProcessing, bv.Status)
		require.Equal(t, map[ingest.JobState]int{ingest.JobCompleted: 1, ingest.JobHeld: 2}, bv.Counts)
		for _, j := range []api.TaskID{j1, j2} {
			v := e.jobView(j)
			require.True(t, v.CollectionHeld)
			require.Equal(t, api.StatusScheduled, v.TaskStatus)
		}
		// Batches ls counts them the same way.
		list, _, err := e.admin.Batches(e.ctx, "coll", "", 10)
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, bv.Counts, list[0].Counts)

		require.NoError(t, e.admin.ReleaseCollection(e.ctx, "coll"))
		bt := e.await(batch)
		require.Equal(t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
		require.Equal(t, map[ingest.JobState]int{ingest.JobCompleted: 3}, e.batchView(batch).Counts)
	})
}

// TestKilledNodeMidDownload SIGKILLs a node process while a job downloads:
// another node takes the job over after its lease, keeps the files already
// downloaded, and completes it; nothing is stored twice.
func TestKilledNodeMidDownload(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Each node must keep its lease until the doomed one is killed: a run
	// whose node cannot renew in time is taken over, correctly, and counts
	// as one more attempt (with one-second leases, a busy machine made the
	// job's attempt 3). The doomed node renews when two thirds of its lease
	// are left, so a few seconds leave a renewal seconds; the survivor's
	// lease does not bound the takeover, only the doomed node's does.
	const childLease, survivorLease = 5 * time.Second, time.Minute
	child := childtest.Start(t, envChildDSN+"="+e.dsn, envChildNode+"=doomed",
		envChildWork+"="+e.work, envChildStorage+"="+e.storage, envChildLease+"="+fmt.Sprint(childLease.Milliseconds()))

	blocked := e.fs.blockFirst("/files/obj/c.bin")
	batch := e.submit(manifest(
		e.fileLine("obj", "a.bin", "sha256", content("a", 30000)),
		e.fileLine("obj", "b.bin", "md5", content("b", 20000)),
		e.fileLine("obj", "c.bin", "sha512", content("c", 40000)),
	))
	job := ingest.JobID(batch, 0)
	select {
	case <-blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("the child node did not start downloading")
	}
	waitFor(t, 20*time.Second, "a.bin and b.bin to be downloaded and checkpointed", func() bool {
		p := e.jobProgress(job)
		_, a := p.Downloaded["a.bin"]
		_, b := p.Downloaded["b.bin"]
		return p.Status == ingest.JobDownloading && a && b
	})
	require.NoError(t, child.Kill())
	killed := time.Now()

	e.server("survivor", func(cfg *ingest.Config) { cfg.Lease = survivorLease })
	bt := e.await(batch)
	require.Equal(t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
	t.Logf("the job completed %s after the SIGKILL (lease %s)", time.Since(killed).Round(time.Millisecond), childLease)
	jt, err := e.client.Get(e.ctx, job)
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, jt.Status)
	require.Equal(t, "survivor", jt.Node)
	require.Equal(t, 2, jt.Attempt, "one run on each node")
	p := e.jobProgress(job)
	require.Equal(t, ingest.JobCompleted, p.Status)
	require.Contains(t, history(p.History), "Provisioning>Downloading")
	require.Equal(t, 1, countOf(history(p.History), "Provisioning>Downloading"), "the takeover resumed in Downloading")

	// The files downloaded before the kill were not fetched again; the one
	// cut off was fetched twice; nothing was estimated twice.
	require.Equal(t, 1, e.fs.count("GET", "/files/obj/a.bin"))
	require.Equal(t, 1, e.fs.count("GET", "/files/obj/b.bin"))
	require.Equal(t, 2, e.fs.count("GET", "/files/obj/c.bin"))
	for _, f := range []string{"a.bin", "b.bin", "c.bin"} {
		require.Equal(t, 1, e.fs.count("HEAD", "/files/obj/"+f))
	}
	// Stored once: one version, three files, one inventory row each.
	versions, err := filepath.Glob(filepath.Join(e.storage, "*", "v*"))
	require.NoError(t, err)
	require.Equal(t, []string{p.StoragePath}, versions)
	stored, err := filepath.Glob(filepath.Join(p.StoragePath, "producer", "*"))
	require.NoError(t, err)
	require.Len(t, stored, 3)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_ingest_object`))
	require.Equal(t, 3, e.count(`SELECT count(*) FROM stint_ingest_file`))
	require.Equal(t, int32(1), e.mints.Load())
	entries, err := os.ReadDir(e.work)
	require.NoError(t, err)
	require.Empty(t, entries, "the completed job's working directory is gone")
}

func countOf(s []string, v string) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}
