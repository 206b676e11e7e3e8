package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/stinthq/stint/api"
)

// Admin holds the operator actions on the ingest queue: holds
// of collections and of single jobs or batches, requeue, forced fail and
// delete, and the views of batches and jobs with their Merritt states.
//
// Some actions change the Merritt state of a task that is not running
// (requeue, forced fail, hold, release): they replace its progress with
// api.Operator.SetProgress, a compare-and-set on the previous progress and
// the task's status, so that they never overwrite a run's checkpoint.
type Admin struct {
	client api.Operator
}

// NewAdmin returns the admin actions on the stint database that ops
// reaches: a server or a client-only process.
func NewAdmin(ops api.Operator) *Admin {
	return &Admin{client: ops}
}

// JobView is a job with its Merritt state.
type JobView struct {
	ID      api.TaskID `json:"id"`
	BatchID api.TaskID `json:"batch_id,omitempty"`
	Profile string     `json:"profile"`
	// LocalID is the depositor's identifier of the object, if given.
	LocalID string `json:"local_id,omitempty"`
	// Status is the Merritt state: the progress's, or Held for a held
	// task or a pending job of a held collection, or Failed for a task
	// that failed before its progress could say so.
	Status JobState `json:"status"`
	// CollectionHeld is set when the job's collection is held: it is not
	// picked up until the collection is released.
	CollectionHeld       bool       `json:"collection_held,omitempty"`
	LastSuccessfulStatus JobState   `json:"last_successful_status,omitempty"`
	RetryCount           int        `json:"retry_count"`
	Priority             int        `json:"priority"`
	Identifier           string     `json:"identifier,omitempty"`
	Version              int        `json:"version,omitempty"`
	Note                 string     `json:"note,omitempty"`
	Error                string     `json:"error,omitempty"`
	TaskStatus           api.Status `json:"task_status"`
	Attempt              int        `json:"attempt"`
	Node                 string     `json:"node,omitempty"`
	UpdatedAt            time.Time  `json:"updated_at"`

	progress JobProgress
	task     api.Task
}

// BatchView is a batch with its Merritt state and, from Batch, its jobs.
type BatchView struct {
	ID        api.TaskID `json:"id"`
	Profile   string     `json:"profile"`
	Submitter string     `json:"submitter"`
	// Status is the Merritt state, Held for a pending batch of a held
	// collection.
	Status         BatchState       `json:"status"`
	CollectionHeld bool             `json:"collection_held,omitempty"`
	Report         *Report          `json:"report,omitempty"`
	Reports        int              `json:"reports,omitempty"`
	Notices        []Notice         `json:"notices,omitempty"`
	History        []Transition     `json:"history,omitempty"`
	Error          string           `json:"error,omitempty"`
	TaskStatus     api.Status       `json:"task_status"`
	CreatedAt      time.Time        `json:"created_at"`
	UpdatedAt      time.Time        `json:"updated_at"`
	Counts         map[JobState]int `json:"counts"`
	Jobs           []JobView        `json:"jobs,omitempty"`

	task api.Task
}

// heldSet returns the held group keys.
func (a *Admin) heldSet(ctx context.Context) (map[string]bool, error) {
	keys, err := a.client.HeldGroups(ctx)
	if err != nil {
		return nil, fmt.Errorf("list held collections: %w", err)
	}
	held := make(map[string]bool, len(keys))
	for _, k := range keys {
		held[k] = true
	}
	return held, nil
}

// viewJob derives a job's view from its task.
func viewJob(t api.Task, held map[string]bool) JobView {
	var p JobProgress
	if len(t.Progress) > 0 {
		_ = json.Unmarshal(t.Progress, &p)
	}
	var params JobParams
	_ = json.Unmarshal(t.Params, &params)
	v := JobView{ID: t.ID, BatchID: t.ParentID, Profile: t.GroupKey, LocalID: params.Object.LocalID, Status: p.state(),
		LastSuccessfulStatus: p.LastSuccessfulStatus, RetryCount: p.RetryCount, Priority: t.Priority,
		Identifier: p.Identifier, Version: p.Version, Note: p.Note, Error: p.Error, TaskStatus: t.Status,
		Attempt: t.Attempt, Node: t.Node, UpdatedAt: t.UpdatedAt, progress: p, task: t}
	v.CollectionHeld = held[t.GroupKey] && t.Status != api.StatusRunning && !t.Finished()
	switch {
	case t.Status == api.StatusHeld:
		v.Status = JobHeld
	case v.Status == JobPending && v.CollectionHeld:
		v.Status = JobHeld
	case t.Finished() && t.Status == api.StatusFailure && v.Status != JobFailed:
		v.Status = JobFailed
	}
	if v.Error == "" && t.Error != nil && t.Status == api.StatusFailure {
		v.Error = t.Error.Error()
	}
	return v
}

// viewBatch derives a batch's view from its task.
func viewBatch(t api.Task, held map[string]bool) BatchView {
	var p BatchProgress
	if len(t.Progress) > 0 {
		_ = json.Unmarshal(t.Progress, &p)
	}
	var params struct {
		Profile   string `json:"profile"`
		Submitter string `json:"submitter"`
	}
	_ = json.Unmarshal(t.Params, &params)
	v := BatchView{ID: t.ID, Profile: params.Profile, Submitter: params.Submitter, Status: p.state(),
		Report: p.Report, Reports: p.Reports, Notices: p.Notices, History: p.History, TaskStatus: t.Status,
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, Counts: map[JobState]int{}, task: t}
	v.CollectionHeld = held[t.GroupKey] && t.Status != api.StatusRunning && !t.Finished()
	switch {
	case t.Status == api.StatusHeld:
		v.Status = BatchHeld
	case v.Status == BatchPending && v.CollectionHeld:
		v.Status = BatchHeld
	case t.Finished() && t.Status == api.StatusFailure && v.Status != BatchFailed:
		v.Status = BatchFailed
	}
	if t.Error != nil && t.Status == api.StatusFailure {
		v.Error = t.Error.Error()
	}
	return v
}

// Job returns the view of a job.
func (a *Admin) Job(ctx context.Context, id api.TaskID) (JobView, error) {
	t, err := a.get(ctx, id, JobBehavior)
	if err != nil {
		return JobView{}, err
	}
	held, err := a.heldSet(ctx)
	if err != nil {
		return JobView{}, err
	}
	return viewJob(t, held), nil
}

// Batch returns the view of a batch with its jobs.
func (a *Admin) Batch(ctx context.Context, id api.TaskID) (BatchView, error) {
	t, err := a.get(ctx, id, BatchBehavior)
	if err != nil {
		return BatchView{}, err
	}
	held, err := a.heldSet(ctx)
	if err != nil {
		return BatchView{}, err
	}
	v := viewBatch(t, held)
	jobs, err := listChildren(ctx, a.client, id)
	if err != nil {
		return BatchView{}, err
	}
	for _, jt := range jobs {
		jv := viewJob(jt, held)
		v.Jobs = append(v.Jobs, jv)
		v.Counts[jv.Status]++
	}
	return v, nil
}

// Batches returns a page of batches in id order, after the cursor after,
// with the counts of their jobs by Merritt state, and the cursor of the
// next page (empty on the last).
func (a *Admin) Batches(ctx context.Context, profile string, after api.TaskID, limit int) ([]BatchView, api.TaskID, error) {
	page, err := a.client.List(ctx, api.Filter{Behavior: BatchBehavior, GroupKey: profile, After: after, Limit: limit})
	if err != nil {
		return nil, "", fmt.Errorf("list batches: %w", err)
	}
	held, err := a.heldSet(ctx)
	if err != nil {
		return nil, "", err
	}
	out := make([]BatchView, 0, len(page.Tasks))
	parents := make([]api.TaskID, 0, len(page.Tasks))
	for _, t := range page.Tasks {
		out = append(out, viewBatch(t, held))
		parents = append(parents, t.ID)
	}
	if len(parents) == 0 {
		return out, page.Next, nil
	}
	// The counts of every batch of the page in one query: the jobs' task
	// states and Merritt states.
	counts, err := a.client.CountChildren(ctx, parents, JobBehavior, "status")
	if err != nil {
		return nil, "", fmt.Errorf("count jobs of batches: %w", err)
	}
	index := make(map[api.TaskID]int, len(out))
	for i, v := range out {
		index[v.ID] = i
	}
	for _, c := range counts {
		t := api.Task{Status: c.Status, GroupKey: c.GroupKey}
		if c.Waiting && (t.Status == api.StatusSuccess || t.Status == api.StatusFailure) {
			now := time.Now()
			t.ScheduleNotBefore = &now
		}
		if c.ProgressValue != "" {
			t.Progress, _ = json.Marshal(JobProgress{Status: JobState(c.ProgressValue)})
		}
		out[index[c.ParentID]].Counts[viewJob(t, held).Status] += c.N
	}
	return out, page.Next, nil
}

// get returns a task of the given behavior.
func (a *Admin) get(ctx context.Context, id api.TaskID, want ...api.BehaviorID) (api.Task, error) {
	t, err := a.client.Get(ctx, id)
	if err != nil {
		return t, fmt.Errorf("get %s: %w", id, err)
	}
	for _, b := range want {
		if t.Behavior == b {
			return t, nil
		}
	}
	return t, api.Invalid("id", "%s is a %s task, not %v", id, t.Behavior, want)
}

// conflict returns an error wrapping api.ErrConflict.
func conflict(format string, args ...any) error {
	return fmt.Errorf("%w: %s", api.ErrConflict, fmt.Sprintf(format, args...))
}

// illegal returns err (an illegal transition) wrapping api.ErrConflict too.
func illegal(err error) error { return fmt.Errorf("%w: %w", api.ErrConflict, err) }

// rereportWait bounds how long a requeue waits for a running batch.
const rereportWait = 5 * time.Second

// writeProgress replaces the progress of a task that is not running, if it
// still is old and the task's status is one of statuses.
func (a *Admin) writeProgress(ctx context.Context, id api.TaskID, old json.RawMessage, progress any, statuses ...api.Status) error {
	raw, err := json.Marshal(progress)
	if err != nil {
		return fmt.Errorf("encode progress of %s: %w", id, err)
	}
	if err := a.client.SetProgress(ctx, id, old, raw, statuses...); err != nil {
		if errors.Is(err, api.ErrConflict) {
			return conflict("%s changed meanwhile; try again", id)
		}
		return err
	}
	return nil
}

// Requeue requeues a Failed job at the successor of its last successful
// state with retry_count + 1, and has its batch re-reported (Failed ->
// UpdateReporting) once its requeued jobs have ended. Given a batch, it
// requeues every Failed job of the batch and re-reports it. It returns the
// requeued job ids.
func (a *Admin) Requeue(ctx context.Context, id api.TaskID) ([]api.TaskID, error) {
	t, err := a.get(ctx, id, JobBehavior, BatchBehavior)
	if err != nil {
		return nil, err
	}
	if t.Behavior == JobBehavior {
		if err := a.requeueJob(ctx, t); err != nil {
			return nil, err
		}
		if t.ParentID != "" {
			if err := a.rereport(ctx, t.ParentID); err != nil {
				return nil, err
			}
		}
		return []api.TaskID{id}, nil
	}
	held, err := a.heldSet(ctx)
	if err != nil {
		return nil, err
	}
	if v := viewBatch(t, held); v.Status != BatchFailed {
		return nil, illegal(fmt.Errorf("%w: requeue of batch %s that is %s, not Failed", ErrIllegalTransition, id, v.Status))
	}
	jobs, err := listChildren(ctx, a.client, id)
	if err != nil {
		return nil, err
	}
	var requeued []api.TaskID
	for _, jt := range jobs {
		if viewJob(jt, held).Status != JobFailed || !jt.Finished() {
			continue
		}
		if err := a.requeueJob(ctx, jt); err != nil {
			return requeued, err
		}
		requeued = append(requeued, jt.ID)
	}
	return requeued, a.rereport(ctx, id)
}

// requeueJob requeues one failed job.
func (a *Admin) requeueJob(ctx context.Context, t api.Task) error {
	if t.Status != api.StatusFailure || !t.Finished() {
		var p JobProgress
		_ = json.Unmarshal(t.Progress, &p)
		return illegal(fmt.Errorf("%w: requeue of job %s that is %s (task %s), not Failed",
			ErrIllegalTransition, t.ID, p.state(), t.Status))
	}
	var p JobProgress
	if len(t.Progress) > 0 {
		if err := json.Unmarshal(t.Progress, &p); err != nil {
			return fmt.Errorf("decode progress of %s: %w", t.ID, err)
		}
	}
	if p.state() == JobFailed {
		if err := p.Requeue(time.Now().UTC()); err != nil {
			return illegal(err)
		}
		if err := a.writeProgress(ctx, t.ID, t.Progress, p, api.StatusFailure); err != nil {
			return err
		}
	}
	// Else the task failed before its progress said Failed (the engine
	// gave up on it): it resumes at the stage it was in.
	if err := a.client.Retry(ctx, t.ID); err != nil {
		return fmt.Errorf("requeue %s: %w", t.ID, err)
	}
	return nil
}

// rereport runs a Failed batch again: it waits for its requeued jobs and
// reports again. A batch that is not Failed (still processing, or already
// re-reporting) is left alone: it reports when its jobs end.
func (a *Admin) rereport(ctx context.Context, batch api.TaskID) error {
	// A batch running right now may be reporting without the requeued
	// job: wait (a little) for its run to end, then look.
	deadline := time.Now().Add(rereportWait)
	var bt api.Task
	for {
		var err error
		bt, err = a.client.Get(ctx, batch)
		if errors.Is(err, api.ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("get batch %s: %w", batch, err)
		}
		if bt.Status != api.StatusRunning || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	if bt.Status != api.StatusFailure || !bt.Finished() {
		return nil
	}
	if err := a.client.Retry(ctx, batch); err != nil && !errors.Is(err, api.ErrConflict) {
		return fmt.Errorf("re-report batch %s: %w", batch, err)
	}
	return nil
}

// Fail sends a job that waits (not running, not ended) to Failed, where
// it stays until requeued. The job fails when it is next picked up. A
// transition the table does not allow (a Held job, say) is refused.
func (a *Admin) Fail(ctx context.Context, id api.TaskID) error {
	t, err := a.get(ctx, id, JobBehavior)
	if err != nil {
		return err
	}
	if t.Status == api.StatusRunning {
		return conflict("job %s is running; it can be failed while it waits", id)
	}
	held, err := a.heldSet(ctx)
	if err != nil {
		return err
	}
	v := viewJob(t, held)
	p := v.progress
	if v.Status == JobHeld {
		p.Status = JobHeld
	}
	if t.Finished() || t.Status != api.StatusScheduled {
		return illegal(fmt.Errorf("%w: job %s -> Failed (the job is %s)", ErrIllegalTransition, v.Status, v.Status))
	}
	from := p.state()
	if err := p.Transition(JobFailed, time.Now().UTC()); err != nil {
		return illegal(err)
	}
	p.Error, p.ErrorCode, p.FailedStage, p.FailRequested = "failed by an admin", "failed_by_admin", from, true
	return a.writeProgress(ctx, id, t.Progress, p, api.StatusScheduled)
}

// Delete deletes a job or a batch where Merritt allows it: a Held or
// Failed one (Merritt's Held -> Deleted and Failed -> Deleted), or a
// Completed one (the cleanup the upstream tool does too). A batch is
// deleted with its jobs, none of which may be running. Working
// directories reachable from here are removed.
func (a *Admin) Delete(ctx context.Context, id api.TaskID) error {
	t, err := a.get(ctx, id, JobBehavior, BatchBehavior)
	if err != nil {
		return err
	}
	held, err := a.heldSet(ctx)
	if err != nil {
		return err
	}
	if t.Behavior == JobBehavior {
		v := viewJob(t, held)
		if err := deletable(string(v.Status), v.Status == JobCompleted || JobTransitionAllowed(v.Status, JobDeleted), t); err != nil {
			return err
		}
		return a.removeJob(ctx, v)
	}
	v := viewBatch(t, held)
	if err := deletable(string(v.Status), v.Status == BatchCompleted || BatchTransitionAllowed(v.Status, BatchDeleted), t); err != nil {
		return err
	}
	jobs, err := listChildren(ctx, a.client, id)
	if err != nil {
		return err
	}
	for _, jt := range jobs {
		if jt.Status == api.StatusRunning {
			return conflict("batch %s: job %s is running", id, jt.ID)
		}
	}
	for _, jt := range jobs {
		if err := a.removeJob(ctx, viewJob(jt, held)); err != nil && !errors.Is(err, api.ErrNotFound) {
			return err
		}
	}
	if err := a.client.Remove(ctx, id); err != nil {
		return fmt.Errorf("delete batch %s: %w", id, err)
	}
	return nil
}

func deletable(state string, allowed bool, t api.Task) error {
	if !allowed || t.Status == api.StatusRunning {
		return illegal(fmt.Errorf("%w: delete of %s %s that is %s (only Held, Failed or Completed)",
			ErrIllegalTransition, t.Behavior, t.ID, state))
	}
	return nil
}

func (a *Admin) removeJob(ctx context.Context, v JobView) error {
	if err := a.client.Remove(ctx, v.ID); err != nil {
		return fmt.Errorf("delete job %s: %w", v.ID, err)
	}
	if dir := v.progress.WorkDir; dir != "" && filepath.IsAbs(dir) {
		// Best effort: the directory is on the node that ran the job.
		_ = os.RemoveAll(dir)
	}
	return nil
}
