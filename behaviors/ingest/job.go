package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// JobResult is the result of a job that completed.
type JobResult struct {
	// Identifier and Version name the stored object version.
	Identifier string `json:"identifier"`
	Version    int    `json:"version"`
	LocalID    string `json:"local_id,omitempty"`
	// StoragePath is the object version's directory in storage.
	StoragePath string `json:"storage_path"`
	// Files and Bytes count what was stored.
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
	// RetryCount counts the admin requeues it took.
	RetryCount int `json:"retry_count"`
}

// jobBehavior is ingest.job.
type jobBehavior struct {
	starter
	env *env
}

// Kind returns Job.
func (b *jobBehavior) Kind() api.Kind[JobParams, JobResult] { return Job }

// TaskID derives the id from the batch and the object's index.
func (b *jobBehavior) TaskID(_ spi.IDs, p JobParams) api.TaskID { return JobID(p.BatchID, p.Index) }

// Policy shares the ingest policy and adds the per-collection and per-node
// caps.
func (b *jobBehavior) Policy() spi.Policy {
	p := b.env.policy()
	if b.env != nil {
		p.GroupConcurrency = b.env.cfg.JobsPerCollection
		p.MaxConcurrency = b.env.cfg.JobsPerNode
	}
	return p
}

// Run carries the job's object through the stages, resuming after the last
// successful one.
func (b *jobBehavior) Run(ctx context.Context, rc spi.RunContext, p JobParams) (JobResult, error) {
	if b.env == nil {
		return JobResult{}, errNotConfigured
	}
	j := &jobRun{env: b.env, cfg: &b.env.cfg, rc: rc, params: p, id: rc.TaskID()}
	if _, err := rc.Progress(&j.prog); err != nil {
		return JobResult{}, err
	}
	return j.run(ctx)
}

// jobRun is one run of a job.
type jobRun struct {
	env    *env
	cfg    *Config
	rc     spi.RunContext
	params JobParams
	id     api.TaskID

	mu   sync.Mutex // guards prog while downloads run in parallel
	prog JobProgress
}

// stage is the work of one stage. On success the run moves the job to the
// next stage and checkpoints, unless the stage did that itself.
type stage func(ctx context.Context) error

func (j *jobRun) stages() map[JobState]stage {
	return map[JobState]stage{
		JobEstimating:   j.estimate,
		JobProvisioning: j.provision,
		JobDownloading:  j.download,
		JobProcessing:   j.process,
		JobStoring:      j.store,
		JobRecording:    j.record,
		JobNotify:       j.notify,
	}
}

func (j *jobRun) run(ctx context.Context) (JobResult, error) {
	now := time.Now().UTC()
	switch j.prog.state() {
	case JobCompleted:
		j.cleanup()
		return j.result(), nil
	case JobDeleted:
		return JobResult{}, api.Permanent("deleted", "job was deleted")
	case JobFailed:
		if j.prog.FailRequested {
			// An admin failed the job while it waited: fail it now.
			j.prog.FailRequested = false
			if err := j.checkpoint(ctx); err != nil {
				return JobResult{}, err
			}
			return JobResult{}, api.Permanent(j.prog.ErrorCode, "%s", j.prog.Error)
		}
		if j.rc.Attempt() > 1 {
			// A takeover of a run that had failed but not yet finished:
			// the job stays Failed.
			return JobResult{}, api.Permanent(j.prog.ErrorCode, "%s", j.prog.Error)
		}
		// The first run after a retry (stint tasks retry): a requeue.
		if err := j.prog.Requeue(now); err != nil {
			return JobResult{}, api.Permanent("bad_state", "%v", err)
		}
		if err := j.checkpoint(ctx); err != nil {
			return JobResult{}, err
		}
	case JobHeld, JobPending:
		// Picked up: a job of a held collection goes to Held and waits
		// there; a released one goes from Held to Pending, then on.
		held, err := j.env.collectionHeld(ctx, j.params.Profile)
		if err != nil {
			return JobResult{}, err
		}
		if held {
			return JobResult{}, j.hold(ctx)
		}
		if j.prog.state() == JobHeld {
			if err := j.prog.Transition(JobPending, now); err != nil {
				return JobResult{}, api.Permanent("bad_state", "%v", err)
			}
		}
	}
	if j.prog.WorkDir == "" {
		j.prog.WorkDir = filepath.Join(j.cfg.WorkDir, dirName(j.id))
	}
	if j.prog.state() == JobPending {
		if err := j.prog.Transition(JobEstimating, now); err != nil {
			return JobResult{}, api.Permanent("bad_state", "%v", err)
		}
		if err := j.checkpoint(ctx); err != nil {
			return JobResult{}, err
		}
	}
	stages := j.stages()
	for j.prog.state() != JobCompleted {
		st := j.prog.state()
		do, ok := stages[st]
		if !ok {
			return JobResult{}, api.Permanent("bad_state", "job is %s", st)
		}
		if err := do(ctx); err != nil {
			return JobResult{}, j.stageFailed(ctx, st, err)
		}
		if j.prog.state() == st {
			if err := j.advance(ctx); err != nil {
				return JobResult{}, err
			}
		}
	}
	j.cleanup()
	j.env.log.Info("ingest: job completed", "job", j.id, "identifier", j.prog.Identifier, "version", j.prog.Version)
	return j.result(), nil
}

// hold moves a job picked up while its collection is held to Held and
// returns the snooze that ends the run. The collection hold keeps the job
// from being picked up again until it is released; the next run moves it
// back to Pending (as ReleaseCollection does, sooner).
func (j *jobRun) hold(ctx context.Context) error {
	if j.prog.state() != JobHeld {
		if err := j.prog.Transition(JobHeld, time.Now().UTC()); err != nil {
			return api.Permanent("bad_state", "%v", err)
		}
		if err := j.checkpoint(ctx); err != nil {
			return err
		}
		j.env.log.Info("ingest: job held: its collection is held", "job", j.id, "profile", j.params.Profile)
	}
	return spi.Snooze(0)
}

// advance moves the job to the successor of its stage and checkpoints.
func (j *jobRun) advance(ctx context.Context) error {
	j.mu.Lock()
	from := j.prog.state()
	err := j.prog.Transition(jobSuccessor[from], time.Now().UTC())
	j.prog.Note = ""
	j.mu.Unlock()
	if err != nil {
		return api.Permanent("bad_state", "%v", err)
	}
	return j.checkpoint(ctx)
}

// stageFailed handles the error of stage st: a snooze, a lost lease or a
// stopping server passes through; anything else sends the job to Failed,
// where it stays until an admin requeues it.
func (j *jobRun) stageFailed(ctx context.Context, st JobState, err error) error {
	var snooze *spi.SnoozeError
	if errors.As(err, &snooze) || errors.Is(err, api.ErrHalt) || ctx.Err() != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return err
	}
	te := spi.AsTaskError(err)
	code := te.Code
	if code == "" {
		code = strings.ToLower(string(st)) + "_failed"
	}
	j.mu.Lock()
	terr := j.prog.Transition(JobFailed, time.Now().UTC())
	j.prog.Error, j.prog.ErrorCode, j.prog.FailedStage = te.Message, code, st
	j.mu.Unlock()
	if terr != nil {
		return api.Permanent("bad_state", "%v", terr)
	}
	if cerr := j.checkpoint(ctx); cerr != nil {
		return cerr
	}
	j.env.log.Warn("ingest: job failed", "job", j.id, "stage", st, "code", code, "err", te.Message)
	return &api.TaskError{Code: code, Message: fmt.Sprintf("%s: %s", st, te.Message),
		Properties: map[string]any{"stage": string(st), "last_successful_status": string(j.prog.LastSuccessfulStatus)}}
}

// checkpoint stores the progress.
func (j *jobRun) checkpoint(ctx context.Context) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.rc.Checkpoint(ctx, j.prog)
}

func (j *jobRun) result() JobResult {
	res := JobResult{Identifier: j.prog.Identifier, Version: j.prog.Version, LocalID: j.params.Object.LocalID,
		StoragePath: j.prog.StoragePath, Files: len(j.params.Object.Files), RetryCount: j.prog.RetryCount}
	for _, f := range j.prog.Downloaded {
		res.Bytes += f.Size
	}
	return res
}

// cleanup deletes the working directory of a completed job.
func (j *jobRun) cleanup() {
	if err := removeWorkDir(j.cfg.WorkDir, j.prog.WorkDir); err != nil {
		j.env.log.Warn("ingest: cannot delete a working directory", "job", j.id, "dir", j.prog.WorkDir, "err", err)
	}
}

// removeWorkDir deletes dir if it lies inside root.
func removeWorkDir(root, dir string) error {
	if dir == "" {
		return nil
	}
	rel, err := filepath.Rel(root, dir)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") || filepath.IsAbs(rel) {
		return fmt.Errorf("%s is not inside the work directory %s", dir, root)
	}
	return os.RemoveAll(dir)
}

// dirName turns a job id into a directory name: unsafe characters become
// '_', and a hash keeps distinct ids apart.
func dirName(id api.TaskID) string {
	safe := []byte(id)
	for i, c := range safe {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			safe[i] = '_'
		}
	}
	sum := sha256.Sum256([]byte(id))
	return strings.TrimLeft(string(safe), ".") + "-" + hex.EncodeToString(sum[:4])
}
