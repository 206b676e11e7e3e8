package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/ingest"
)

// recovery is the set-up of a failure-and-recovery test: a batch of two
// objects, "good" and "bad", whose files the test makes fail.
type recovery struct {
	*tenv
	batch   api.TaskID
	goodJob api.TaskID
	badJob  api.TaskID
}

// startRecovery serves the two objects (bad's files as badFiles), starts a
// node and submits the batch.
func startRecovery(t *testing.T, badFiles func(e *tenv) []line, mod ...func(*ingest.Config)) *recovery {
	e := newEnv(t)
	lines := []line{
		e.fileLine("good", "a.txt", "sha256", []byte("good file a")),
		e.fileLine("good", "b.txt", "md5", []byte("good file b")),
	}
	lines = append(lines, badFiles(e)...)
	e.server("node", mod...)
	r := &recovery{tenv: e}
	r.batch = e.submit(manifest(lines...))
	r.goodJob, r.badJob = ingest.JobID(r.batch, 0), ingest.JobID(r.batch, 1)
	return r
}

// awaitBatchFailed waits for the batch to fail and checks its report.
func (r *recovery) awaitBatchFailed(failed ...api.TaskID) {
	r.t.Helper()
	bt := r.await(r.batch)
	require.Equal(r.t, api.StatusFailure, bt.Status)
	require.Equal(r.t, "batch_failed", bt.Error.Code)
	bv := r.batchView(r.batch)
	require.Equal(r.t, ingest.BatchFailed, bv.Status)
	require.ElementsMatch(r.t, failed, bv.Report.Failed)
	require.Equal(r.t, 2-len(failed), len(bv.Report.Succeeded))
}

// requeueAndComplete requeues the batch's failed jobs (by batch, or by
// each job) and checks that the batch goes Failed -> UpdateReporting ->
// Completed, listing them as recovered.
func (r *recovery) requeueAndComplete(byBatch bool, jobs ...api.TaskID) {
	r.t.Helper()
	if byBatch {
		requeued, err := r.admin.Requeue(r.ctx, r.batch)
		require.NoError(r.t, err)
		require.ElementsMatch(r.t, jobs, requeued)
	} else {
		for _, j := range jobs {
			_, err := r.admin.Requeue(r.ctx, j)
			require.NoError(r.t, err)
		}
	}
	r.awaitRecovered(jobs...)
}

// awaitRecovered checks that the batch goes Failed -> UpdateReporting ->
// Completed, listing the requeued jobs as recovered.
func (r *recovery) awaitRecovered(jobs ...api.TaskID) {
	r.t.Helper()
	bt := r.await(r.batch)
	require.Equal(r.t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
	var res ingest.BatchResult
	require.NoError(r.t, json.Unmarshal(bt.Result, &res))
	require.Len(r.t, res.Report.Succeeded, 2)
	require.Empty(r.t, res.Report.Failed)
	require.ElementsMatch(r.t, jobs, res.Report.Recovered)
	bv := r.batchView(r.batch)
	require.Equal(r.t, []string{"Pending>Processing", "Processing>Reporting", "Reporting>Failed",
		"Failed>UpdateReporting", "UpdateReporting>Completed"}, history(bv.History))
	require.Equal(r.t, 2, bv.Reports)
	for _, j := range jobs {
		p := r.jobProgress(j)
		require.Equal(r.t, ingest.JobCompleted, p.Status)
		require.Equal(r.t, 1, p.RetryCount)
	}
}

// requireFailedAt checks that job failed in stage with code, its last
// successful state being lss.
func (r *recovery) requireFailedAt(job api.TaskID, stage, lss ingest.JobState, code string) {
	r.t.Helper()
	v := r.jobView(job)
	require.Equal(r.t, ingest.JobFailed, v.Status)
	require.Equal(r.t, lss, v.LastSuccessfulStatus)
	require.Zero(r.t, v.RetryCount)
	require.Equal(r.t, api.StatusFailure, v.TaskStatus)
	p := r.jobProgress(job)
	require.Equal(r.t, stage, p.FailedStage)
	require.Equal(r.t, code, p.ErrorCode)
	t, err := r.client.Get(r.ctx, job)
	require.NoError(r.t, err)
	require.Equal(r.t, code, t.Error.Code)
	require.False(r.t, t.Error.Retryable, "a failed job waits for an admin, not for the engine's retries")
}

// requireResumedAt checks, from the job's history, that the requeue moved
// it from Failed to stage and it went on from there to Completed.
func (r *recovery) requireResumedAt(job api.TaskID, stage ingest.JobState) {
	r.t.Helper()
	h := history(r.jobProgress(job).History)
	var after []string
	for i, s := range h {
		if s == "Failed>"+string(stage) {
			after = h[i:]
		}
	}
	require.NotEmpty(r.t, after, "no Failed>%s in %v", stage, h)
	want := []string{"Failed>" + string(stage)}
	for s := stage; s != ingest.JobCompleted; {
		next := map[ingest.JobState]ingest.JobState{ingest.JobEstimating: ingest.JobProvisioning,
			ingest.JobProvisioning: ingest.JobDownloading, ingest.JobDownloading: ingest.JobProcessing,
			ingest.JobProcessing: ingest.JobStoring, ingest.JobStoring: ingest.JobRecording,
			ingest.JobRecording: ingest.JobNotify, ingest.JobNotify: ingest.JobCompleted}[s]
		want = append(want, string(s)+">"+string(next))
		s = next
	}
	require.Equal(r.t, want, after)
}

func TestFailureAndRecovery(t *testing.T) {
	t.Parallel()

	t.Run("download answers 500", func(t *testing.T) {
		t.Parallel()
		r := startRecovery(t, func(e *tenv) []line {
			e.fs.setStatus("/files/bad/2.txt", http.StatusInternalServerError)
			return []line{e.fileLine("bad", "1.txt", "sha1", []byte("bad one")), e.fileLine("bad", "2.txt", "sha1", []byte("bad two"))}
		})
		r.awaitBatchFailed(r.badJob)
		r.requireFailedAt(r.badJob, ingest.JobDownloading, ingest.JobProvisioning, "download_failed")
		require.Equal(t, 2, r.fs.count("GET", "/files/bad/2.txt"), "two attempts")
		require.Equal(t, 1, r.fs.count("GET", "/files/bad/1.txt"))
		require.Equal(t, int32(1), r.mints.Load(), "only the good job got to processing")

		r.fs.setStatus("/files/bad/2.txt", 0)
		r.requeueAndComplete(false, r.badJob)
		r.requireResumedAt(r.badJob, ingest.JobDownloading)

		require.Equal(t, 3, r.fs.count("GET", "/files/bad/2.txt"))
		require.Equal(t, 1, r.fs.count("GET", "/files/bad/1.txt"), "a file downloaded before the failure is kept")
		require.Equal(t, 1, r.fs.count("HEAD", "/files/bad/1.txt"), "estimating is not repeated")
		require.Equal(t, 1, r.fs.count("HEAD", "/files/bad/2.txt"))
		require.Equal(t, int32(2), r.mints.Load())
	})

	t.Run("bad digest", func(t *testing.T) {
		t.Parallel()
		var l line
		r := startRecovery(t, func(e *tenv) []line {
			l = e.fileLine("bad", "x.bin", "sha512", []byte("the real content"))
			e.fs.add("/files/bad/x.bin", []byte("corrupted content"))
			return []line{l}
		})
		r.awaitBatchFailed(r.badJob)
		r.requireFailedAt(r.badJob, ingest.JobDownloading, ingest.JobProvisioning, "digest_mismatch")
		require.Equal(t, 1, r.fs.count("GET", "/files/bad/x.bin"), "a digest mismatch is not retried")
		work := r.jobProgress(r.badJob).WorkDir
		_, err := os.Stat(filepath.Join(work, "producer", "x.bin"))
		require.ErrorIs(t, err, os.ErrNotExist, "a file that failed its digest is not kept")

		r.fs.add("/files/bad/x.bin", []byte("the real content"))
		r.requeueAndComplete(true, r.badJob)
		r.requireResumedAt(r.badJob, ingest.JobDownloading)
		require.Equal(t, 2, r.fs.count("GET", "/files/bad/x.bin"))
		require.Equal(t, 1, r.fs.count("HEAD", "/files/bad/x.bin"))
	})

	t.Run("callback down", func(t *testing.T) {
		t.Parallel()
		r := startRecovery(t, func(e *tenv) []line {
			e.fs.setCallbackStatus(http.StatusServiceUnavailable)
			return []line{e.fileLine("bad", "c.txt", "", []byte("bad c"))}
		})
		r.awaitBatchFailed(r.goodJob, r.badJob)
		for _, j := range []api.TaskID{r.goodJob, r.badJob} {
			r.requireFailedAt(j, ingest.JobNotify, ingest.JobRecording, "callback_failed")
		}
		require.Equal(t, 4, r.fs.count("POST", "/callback"), "two attempts per job")
		require.Equal(t, 2, r.count(`SELECT count(*) FROM stint_ingest_object`), "recorded before the callback")
		identifiers := map[api.TaskID]string{}
		for _, j := range []api.TaskID{r.goodJob, r.badJob} {
			identifiers[j] = r.jobProgress(j).Identifier
		}

		r.fs.setCallbackStatus(0)
		r.requeueAndComplete(true, r.goodJob, r.badJob)
		r.requireResumedAt(r.goodJob, ingest.JobNotify)
		r.requireResumedAt(r.badJob, ingest.JobNotify)
		require.Equal(t, 6, r.fs.count("POST", "/callback"))
		require.Len(t, r.fs.callbacks(), 2)
		// Nothing before Notify ran again: no fetches, no second
		// identifier, no second version or inventory row.
		for _, p := range []string{"/files/good/a.txt", "/files/good/b.txt", "/files/bad/c.txt"} {
			require.Equal(t, 1, r.fs.count("HEAD", p), p)
			require.Equal(t, 1, r.fs.count("GET", p), p)
		}
		require.Equal(t, int32(2), r.mints.Load(), "no identifier is minted twice")
		for j, id := range identifiers {
			p := r.jobProgress(j)
			require.Equal(t, id, p.Identifier)
			require.Equal(t, 1, p.Version)
		}
		require.Equal(t, 2, r.count(`SELECT count(*) FROM stint_ingest_object`))
		require.Equal(t, 3, r.count(`SELECT count(*) FROM stint_ingest_file`))
	})

	t.Run("minting fails in processing", func(t *testing.T) {
		t.Parallel()
		var failMint atomic.Bool
		failMint.Store(true)
		r := startRecovery(t, func(e *tenv) []line {
			return []line{e.fileLine("bad", "m.txt", "md5", []byte("mint me"))}
		}, func(cfg *ingest.Config) {
			// Both jobs mint; the first call fails.
			mint := cfg.Mint
			cfg.Mint = func(ctx context.Context) (string, error) {
				if failMint.Swap(false) {
					return "", errors.New("minter unavailable")
				}
				return mint(ctx)
			}
			cfg.JobsPerCollection = 1 // one job at a time: the first job's mint fails
		})
		r.awaitBatchFailed(r.goodJob)
		r.requireFailedAt(r.goodJob, ingest.JobProcessing, ingest.JobDownloading, "mint_failed")
		r.requeueAndComplete(false, r.goodJob)
		r.requireResumedAt(r.goodJob, ingest.JobProcessing)
		for _, p := range []string{"/files/good/a.txt", "/files/good/b.txt"} {
			require.Equal(t, 1, r.fs.count("GET", p), "downloads are not repeated: %s", p)
		}
	})

	t.Run("not enough space waits in provisioning", func(t *testing.T) {
		t.Parallel()
		r := startRecovery(t, func(e *tenv) []line {
			e.free.Store(10) // less than any estimate
			return []line{e.fileLine("bad", "big.bin", "sha256", content("big", 50000))}
		})
		// Both jobs wait in Provisioning, re-checking, never failing. The
		// jobs reach it at their own pace: wait for both, not for a count
		// of checks that one job alone can make.
		waitFor(t, 20*time.Second, "both jobs in provisioning after six space checks", func() bool {
			return r.checks.Load() >= 6 && r.jobView(r.goodJob).Status == ingest.JobProvisioning &&
				r.jobView(r.badJob).Status == ingest.JobProvisioning
		})
		for _, j := range []api.TaskID{r.goodJob, r.badJob} {
			v := r.jobView(j)
			require.Equal(t, ingest.JobProvisioning, v.Status)
			require.Equal(t, ingest.JobEstimating, v.LastSuccessfulStatus)
			require.Contains(t, v.Note, "waiting for disk space")
			require.NotEqual(t, api.StatusFailure, v.TaskStatus)
			tk, err := r.client.Get(r.ctx, j)
			require.NoError(t, err)
			require.Zero(t, tk.Errors, "waiting is not a failure")
		}
		require.Equal(t, 50000, int(r.jobProgress(r.badJob).SpaceNeeded), "the estimate from HEAD")
		require.Zero(t, r.fs.count("GET", "/files/bad/big.bin"))
		bv := r.batchView(r.batch)
		require.Equal(t, ingest.BatchProcessing, bv.Status)
		require.Equal(t, map[ingest.JobState]int{ingest.JobProvisioning: 2}, bv.Counts)

		r.free.Store(-1)
		bt := r.await(r.batch)
		require.Equal(t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
		require.Equal(t, 1, r.fs.count("HEAD", "/files/bad/big.bin"), "estimating is not repeated while waiting")
		require.Equal(t, 1, r.fs.count("GET", "/files/bad/big.bin"))
		require.Zero(t, r.jobProgress(r.badJob).RetryCount)
	})
}
