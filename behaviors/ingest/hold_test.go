package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

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
			p := e.jobProgress(j)
			require.Equal(t, ingest.JobHeld, p.Status, "the hold is stored, not only shown")
			require.Equal(t, []string{"Pending>Held"}, history(p.History))
		}
		// Batches ls counts them the same way.
		list, _, err := e.admin.Batches(e.ctx, "coll", "", 10)
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, bv.Counts, list[0].Counts)

		// The release moves them back to Pending (the paused queue keeps
		// them there to be looked at).
		require.NoError(t, e.admin.PauseQueue(e.ctx))
		require.NoError(t, e.admin.ReleaseCollection(e.ctx, "coll"))
		for _, j := range []api.TaskID{j1, j2} {
			p := e.jobProgress(j)
			require.Equal(t, ingest.JobPending, p.Status)
			require.Equal(t, []string{"Pending>Held", "Held>Pending"}, history(p.History))
			require.Equal(t, ingest.JobPending, e.jobView(j).Status)
		}
		require.NoError(t, e.admin.ResumeQueue(e.ctx))
		bt := e.await(batch)
		require.Equal(t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
		require.Equal(t, map[ingest.JobState]int{ingest.JobCompleted: 3}, e.batchView(batch).Counts)
		for _, j := range []api.TaskID{j1, j2} {
			require.Equal(t, []string{"Pending>Held", "Held>Pending", "Pending>Estimating"}, history(e.jobProgress(j).History)[:3])
		}
	})

	t.Run("lifted by a plain group release", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.server("node")
		require.NoError(t, e.admin.PauseQueue(e.ctx))
		batch := e.submit(manifest(e.fileLine("o1", "a", "", []byte("a"))))
		require.NoError(t, e.admin.HoldCollection(e.ctx, "coll"))
		require.Equal(t, ingest.BatchHeld, e.batchView(batch).Status)
		require.ErrorIs(t, e.admin.Release(e.ctx, batch), api.ErrConflict, "the collection is still held")
		// The group hold is lifted otherwise (stint's group release):
		// the batch still says Held, and Release moves it to Pending.
		require.NoError(t, e.client.ReleaseGroup(e.ctx, "coll"))
		require.Equal(t, ingest.BatchHeld, e.batchView(batch).Status)
		require.NoError(t, e.admin.Release(e.ctx, batch))
		v := e.batchView(batch)
		require.Equal(t, ingest.BatchPending, v.Status)
		require.Equal(t, []string{"Pending>Held", "Held>Pending"}, history(v.History))
		require.ErrorIs(t, e.admin.Release(e.ctx, batch), api.ErrConflict, "a Pending batch is not held")
		require.NoError(t, e.admin.ResumeQueue(e.ctx))
		bt := e.await(batch)
		require.Equal(t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
	})

	t.Run("picked up after the hold", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		// The collection is held the moment the job is picked up, before
		// its run starts: the run finds the hold.
		pickedUp := e.holdAtPickup(ingest.JobBehavior)
		// One job: the hold finds it running (claimed), so only its run
		// can move it to Held.
		batch := e.submit(manifest(e.fileLine("o1", "a", "", []byte("a"))))
		picked := ingest.JobID(batch, 0)
		e.waitClosed(pickedUp, "the pickup")
		waitFor(t, time.Minute, "the picked-up job to go to Held", func() bool {
			return e.jobView(picked).TaskStatus == api.StatusScheduled && e.jobProgress(picked).Status == ingest.JobHeld
		})
		require.Equal(t, []string{"Pending>Held"}, history(e.jobProgress(picked).History))
		require.Equal(t, ingest.JobHeld, e.jobView(picked).Status)
		require.Never(t, func() bool { return e.jobView(picked).TaskStatus == api.StatusRunning },
			300*time.Millisecond, 20*time.Millisecond, "the held job was picked up again")

		require.NoError(t, e.admin.ReleaseCollection(e.ctx, "coll"))
		bt := e.await(batch)
		require.Equal(t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
		require.Equal(t, []string{"Pending>Held", "Held>Pending", "Pending>Estimating"}, history(e.jobProgress(picked).History)[:3])
	})

	t.Run("batch picked up after the hold", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		pickedUp := e.holdAtPickup(ingest.BatchBehavior)
		batch := e.submit(manifest(e.fileLine("o1", "a", "", []byte("a"))))
		e.waitClosed(pickedUp, "the pickup")
		var p ingest.BatchProgress
		waitFor(t, time.Minute, "the batch to go to Held", func() bool {
			bt, err := e.client.Get(e.ctx, batch)
			require.NoError(t, err)
			return bt.Status == api.StatusScheduled && json.Unmarshal(bt.Progress, &p) == nil && p.Status == ingest.BatchHeld
		})
		require.Equal(t, []string{"Pending>Held"}, history(p.History))
		require.Zero(t, p.Jobs, "no job was spawned")
		require.Equal(t, ingest.BatchHeld, e.batchView(batch).Status)

		require.NoError(t, e.admin.ReleaseCollection(e.ctx, "coll"))
		bt := e.await(batch)
		require.Equal(t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
		require.Equal(t, []string{"Pending>Held", "Held>Pending", "Pending>Processing"}, history(e.batchView(batch).History)[:3])
	})
}

// holdAtPickup starts a node that holds collection coll when it picks up
// the first task of behavior b, before the task's run starts. The channel
// is closed once the hold is set. The node's lease is long enough for the
// hold to be set while the run holds it: a run that lost its lease
// meanwhile would not start, and the hold would keep the task from being
// picked up again.
func (e *tenv) holdAtPickup(b api.BehaviorID) <-chan struct{} {
	var once sync.Once
	held := make(chan struct{})
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(onStart(func(s sdktrace.ReadWriteSpan) {
		if s.Name() == "stint.run "+string(b) {
			once.Do(func() {
				// On the node's goroutine: report, do not stop the test.
				if err := e.admin.HoldCollection(e.ctx, "coll"); err != nil {
					e.t.Errorf("hold the collection at pickup: %v", err)
				}
				close(held)
			})
		}
	})))
	e.server("node", func(cfg *ingest.Config) { cfg.Lease = time.Minute })
	return held
}

// waitClosed waits until ch is closed, or fails the test when the test's
// context ends first.
func (e *tenv) waitClosed(ch <-chan struct{}, what string) {
	e.t.Helper()
	select {
	case <-ch:
	case <-e.ctx.Done():
		e.t.Fatalf("%s did not happen", what)
	}
}

// onStart is a span processor that calls fn when a span starts.
type onStart func(sdktrace.ReadWriteSpan)

func (f onStart) OnStart(_ context.Context, s sdktrace.ReadWriteSpan) { f(s) }
func (onStart) OnEnd(sdktrace.ReadOnlySpan)                           {}
func (onStart) Shutdown(context.Context) error                        { return nil }
func (onStart) ForceFlush(context.Context) error                      { return nil }

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
