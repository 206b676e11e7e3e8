package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// BatchResult is the result of a batch that completed.
type BatchResult struct {
	// Status is BatchCompleted.
	Status BatchState `json:"status"`
	// Report lists the batch's jobs by outcome.
	Report Report `json:"report"`
}

// Report is a batch's report, made when its last job has ended.
type Report struct {
	// Jobs is the number of jobs the batch spawned.
	Jobs int `json:"jobs"`
	// Succeeded and Failed are the ids of the jobs that completed and
	// failed.
	Succeeded []api.TaskID `json:"succeeded"`
	Failed    []api.TaskID `json:"failed"`
	// Deleted counts jobs an admin deleted.
	Deleted int `json:"deleted,omitempty"`
	// Recovered are the jobs that succeeded since the previous report
	// (after a requeue); set by re-reporting.
	Recovered []api.TaskID `json:"recovered,omitempty"`
	// At is when the report was made.
	At time.Time `json:"at"`
}

// JobID returns the id of the job of object index (from 0) of a batch:
// the batch id followed by "/j" and the index, or a hash of both when that
// would be over 128 characters.
func JobID(batch api.TaskID, index int) api.TaskID {
	id := fmt.Sprintf("%s/j%05d", batch, index)
	if len(id) <= 128 {
		return api.TaskID(id)
	}
	return spi.NewIDs(JobBehavior).Deterministic(string(batch), index)
}

// batchBehavior is ingest.batch.
type batchBehavior struct {
	starter
	env *env
}

// Kind returns Batch.
func (b *batchBehavior) Kind() api.Kind[BatchParams, BatchResult] { return Batch }

// TaskID returns a new unique id: every submission is its own batch.
func (b *batchBehavior) TaskID(ids spi.IDs, _ BatchParams) api.TaskID { return ids.Unique() }

// Policy shares the ingest policy.
func (b *batchBehavior) Policy() spi.Policy { return b.env.policy() }

// Run moves the batch through its states: it spawns the jobs, waits for
// them, and reports.
func (b *batchBehavior) Run(ctx context.Context, rc spi.RunContext, p BatchParams) (BatchResult, error) {
	if b.env == nil {
		return BatchResult{}, errNotConfigured
	}
	_, tasks, err := b.env.db(ctx)
	if err != nil {
		return BatchResult{}, err
	}
	r := &batchRun{env: b.env, rc: rc, tasks: tasks, params: p, id: rc.TaskID()}
	if _, err := rc.Progress(&r.prog); err != nil {
		return BatchResult{}, err
	}
	return r.run(ctx)
}

// batchRun is one run of a batch.
type batchRun struct {
	env    *env
	rc     spi.RunContext
	tasks  api.Tasks
	params BatchParams
	id     api.TaskID
	prog   BatchProgress
}

func (r *batchRun) run(ctx context.Context) (BatchResult, error) {
	now := time.Now().UTC()
	switch r.prog.state() {
	case BatchHeld, BatchPending:
		// Picked up: a batch of a held collection goes to Held and waits
		// there; a released one goes from Held to Pending, then on.
		held, err := r.env.collectionHeld(ctx, r.params.Profile)
		if err != nil {
			return BatchResult{}, err
		}
		if held {
			return BatchResult{}, r.hold(ctx)
		}
		if r.prog.state() == BatchHeld {
			if err := r.prog.Transition(BatchPending, now); err != nil {
				return BatchResult{}, err
			}
		}
		return BatchResult{}, r.spawn(ctx)
	case BatchProcessing:
		jobs, done, err := r.jobsEnded(ctx)
		if err != nil || !done {
			return BatchResult{}, err
		}
		if err := r.prog.Transition(BatchReporting, time.Now().UTC()); err != nil {
			return BatchResult{}, err
		}
		return r.report(ctx, jobs)
	case BatchFailed:
		// Retried after requeues: re-report once the requeued jobs ended.
		jobs, done, err := r.jobsEnded(ctx)
		if err != nil || !done {
			return BatchResult{}, err
		}
		if err := r.prog.Transition(BatchUpdateReporting, time.Now().UTC()); err != nil {
			return BatchResult{}, err
		}
		return r.report(ctx, jobs)
	case BatchReporting, BatchUpdateReporting:
		// A run that stopped while reporting: report again.
		jobs, done, err := r.jobsEnded(ctx)
		if err != nil || !done {
			return BatchResult{}, err
		}
		return r.report(ctx, jobs)
	case BatchCompleted:
		if r.prog.Report == nil {
			return BatchResult{}, errors.New("batch completed without a report")
		}
		return BatchResult{Status: BatchCompleted, Report: *r.prog.Report}, nil
	default:
		return BatchResult{}, api.Permanent("bad_state", "batch is %s", r.prog.state())
	}
}

// hold moves a batch picked up while its collection is held to Held and
// returns the snooze that ends the run; the collection hold keeps it from
// being picked up again until it is released.
func (r *batchRun) hold(ctx context.Context) error {
	if r.prog.state() != BatchHeld {
		if err := r.prog.Transition(BatchHeld, time.Now().UTC()); err != nil {
			return err
		}
		if err := r.rc.Checkpoint(ctx, r.prog); err != nil {
			return err
		}
		r.env.log.Info("ingest: batch held: its collection is held", "batch", r.id, "profile", r.params.Profile)
	}
	return spi.Snooze(0)
}

// spawn submits one job per object and waits for them. Jobs have
// deterministic ids and share-on-resubmit dedup, so a run that stopped after
// spawning spawns nothing new the second time.
func (r *batchRun) spawn(ctx context.Context) error {
	objs := r.params.Objects()
	reqs := make([]api.SubmitRequest, len(objs))
	for i, o := range objs {
		raw, err := json.Marshal(JobParams{BatchID: r.id, Index: i, Profile: r.params.Profile,
			Submitter: r.params.Submitter, Title: r.params.Title, Creator: r.params.Creator,
			Date: r.params.Date, Object: o})
		if err != nil {
			return fmt.Errorf("encode job %d: %w", i, err)
		}
		reqs[i] = api.SubmitRequest{
			Behavior: JobBehavior,
			ID:       JobID(r.id, i),
			Params:   raw,
			GroupKey: r.params.Profile,
			Priority: r.params.Priority,
			// Ties of priority go by creation: one microsecond apart, the
			// jobs are due (and so picked up) in manifest order.
			Delay: time.Duration(i) * time.Microsecond,
		}
	}
	if _, err := r.rc.Spawn(ctx, reqs...); err != nil {
		if errors.Is(err, api.ErrInvalid) {
			return api.Permanent("invalid_job", "spawn %d jobs: %v", len(reqs), err)
		}
		return fmt.Errorf("spawn %d jobs: %w", len(reqs), err)
	}
	r.prog.Jobs = len(reqs)
	if err := r.prog.Transition(BatchProcessing, time.Now().UTC()); err != nil {
		return err
	}
	if err := r.rc.Checkpoint(ctx, r.prog); err != nil {
		return err
	}
	r.env.log.Info("ingest: batch processing", "batch", r.id, "profile", r.params.Profile, "jobs", len(reqs))
	if err := r.notify(ctx, NoticeQueued); err != nil {
		return err
	}
	return spi.WaitForChildren(r.env.cfg.BatchWaitMax)
}

// jobsEnded lists the batch's jobs and reports whether all have ended. When
// some have not, it returns the wait to return from the run as the error.
func (r *batchRun) jobsEnded(ctx context.Context) ([]api.Task, bool, error) {
	jobs, err := listChildren(ctx, r.tasks, r.id)
	if err != nil {
		return nil, false, err
	}
	if !slices.ContainsFunc(jobs, func(t api.Task) bool { return !t.Finished() }) {
		return jobs, true, nil
	}
	return nil, false, r.wait(ctx)
}

// wait returns how to wait for the jobs still going: until the engine wakes
// the batch when its last counted child ends, or, when the engine counts
// none (jobs requeued after they had ended are not counted again), by
// polling.
func (r *batchRun) wait(ctx context.Context) error {
	self, err := r.tasks.Get(ctx, r.id)
	if err == nil && self.ChildrenPending > 0 {
		return spi.WaitForChildren(r.env.cfg.BatchWaitMax)
	}
	return spi.Snooze(r.env.cfg.ChildPoll)
}

// report makes the report from the ended jobs and ends the batch Completed,
// or Failed when a job failed.
func (r *batchRun) report(ctx context.Context, jobs []api.Task) (BatchResult, error) {
	rep := Report{Jobs: r.prog.Jobs, Succeeded: []api.TaskID{}, Failed: []api.TaskID{}, At: time.Now().UTC()}
	var before []api.TaskID
	if r.prog.Report != nil {
		before = r.prog.Report.Failed
	}
	for _, t := range jobs {
		switch t.Status {
		case api.StatusSuccess:
			rep.Succeeded = append(rep.Succeeded, t.ID)
			if slices.Contains(before, t.ID) {
				rep.Recovered = append(rep.Recovered, t.ID)
			}
		default:
			rep.Failed = append(rep.Failed, t.ID)
		}
	}
	rep.Deleted = max(r.prog.Jobs-len(jobs), 0)
	r.prog.Report = &rep
	r.prog.Reports++
	end := BatchCompleted
	if len(rep.Failed) > 0 {
		end = BatchFailed
	}
	if err := r.prog.Transition(end, rep.At); err != nil {
		return BatchResult{}, err
	}
	if err := r.rc.Checkpoint(ctx, r.prog); err != nil {
		return BatchResult{}, err
	}
	r.env.log.Info("ingest: batch reported", "batch", r.id, "status", end,
		"succeeded", len(rep.Succeeded), "failed", len(rep.Failed), "deleted", rep.Deleted)
	if err := r.notify(ctx, NoticeReport); err != nil {
		return BatchResult{}, err
	}
	if end == BatchFailed {
		return BatchResult{}, &api.TaskError{Code: "batch_failed",
			Message:    fmt.Sprintf("%d of %d jobs failed", len(rep.Failed), rep.Jobs),
			Properties: map[string]any{"failed": rep.Failed, "succeeded": len(rep.Succeeded)}}
	}
	return BatchResult{Status: BatchCompleted, Report: rep}, nil
}

// listChildren returns every child of a task, in id order.
func listChildren(ctx context.Context, tasks api.Tasks, parent api.TaskID) ([]api.Task, error) {
	var out []api.Task
	f := api.Filter{ParentID: parent, Limit: 1000}
	for {
		page, err := tasks.List(ctx, f)
		if err != nil {
			return nil, fmt.Errorf("list jobs of %s: %w", parent, err)
		}
		out = append(out, page.Tasks...)
		if page.Next == "" {
			return out, nil
		}
		f.After = page.Next
	}
}

// SubmitBatch submits a batch with its profile as group key, so that a
// hold of the collection holds the batch too (the engine takes the group
// key from the submit request, not from the params). Prefer it to a plain
// api.Submit.
func SubmitBatch(ctx context.Context, tasks api.Tasks, p BatchParams, opts ...api.SubmitOption) (*api.Future[BatchResult], error) {
	opts = append([]api.SubmitOption{api.WithGroupKey(p.Profile)}, opts...)
	f, err := api.Submit(ctx, tasks, Batch, p, opts...)
	if err != nil {
		return nil, fmt.Errorf("submit batch: %w", err)
	}
	return f, nil
}
