package ingest

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// JobState is the Merritt state of an ingest job, kept in its task's
// progress.
type JobState string

// The job states of the Merritt ingest queue. The stage states (Estimating
// to Notify) are the stage a job does next, or is doing while it runs.
const (
	JobPending      JobState = "Pending"
	JobHeld         JobState = "Held"
	JobEstimating   JobState = "Estimating"
	JobProvisioning JobState = "Provisioning"
	JobDownloading  JobState = "Downloading"
	JobProcessing   JobState = "Processing"
	JobStoring      JobState = "Storing"
	JobRecording    JobState = "Recording"
	JobNotify       JobState = "Notify"
	JobCompleted    JobState = "Completed"
	JobFailed       JobState = "Failed"
	JobDeleted      JobState = "Deleted"
)

// JobStates lists every job state in pipeline order.
var JobStates = []JobState{JobPending, JobHeld, JobEstimating, JobProvisioning, JobDownloading, JobProcessing,
	JobStoring, JobRecording, JobNotify, JobCompleted, JobFailed, JobDeleted}

// jobTransitions is the Merritt job transition table: the states
// each state may move to. Completed and Deleted are terminal.
var jobTransitions = map[JobState][]JobState{
	JobPending:      {JobHeld, JobEstimating, JobFailed},
	JobHeld:         {JobPending, JobDeleted},
	JobEstimating:   {JobProvisioning, JobFailed},
	JobProvisioning: {JobDownloading, JobFailed},
	JobDownloading:  {JobProcessing, JobFailed},
	JobProcessing:   {JobStoring, JobFailed},
	JobStoring:      {JobRecording, JobFailed},
	JobRecording:    {JobNotify, JobFailed},
	JobNotify:       {JobCompleted, JobFailed},
	JobFailed: {JobPending, JobEstimating, JobProvisioning, JobDownloading, JobProcessing, JobStoring,
		JobRecording, JobNotify, JobDeleted},
}

// jobSuccessor is the success path: the stage after each stage.
var jobSuccessor = map[JobState]JobState{
	JobEstimating:   JobProvisioning,
	JobProvisioning: JobDownloading,
	JobDownloading:  JobProcessing,
	JobProcessing:   JobStoring,
	JobStoring:      JobRecording,
	JobRecording:    JobNotify,
	JobNotify:       JobCompleted,
}

// BatchState is the Merritt state of an ingest batch, kept in its task's
// progress.
type BatchState string

// The batch states of the Merritt ingest queue.
const (
	BatchPending         BatchState = "Pending"
	BatchHeld            BatchState = "Held"
	BatchProcessing      BatchState = "Processing"
	BatchReporting       BatchState = "Reporting"
	BatchUpdateReporting BatchState = "UpdateReporting"
	BatchCompleted       BatchState = "Completed"
	BatchFailed          BatchState = "Failed"
	BatchDeleted         BatchState = "Deleted"
)

// BatchStates lists every batch state.
var BatchStates = []BatchState{BatchPending, BatchHeld, BatchProcessing, BatchReporting, BatchUpdateReporting,
	BatchCompleted, BatchFailed, BatchDeleted}

// batchTransitions is the Merritt batch transition table: the states
// each state may move to.
var batchTransitions = map[BatchState][]BatchState{
	BatchPending:         {BatchHeld, BatchProcessing},
	BatchHeld:            {BatchPending, BatchDeleted},
	BatchProcessing:      {BatchReporting, BatchFailed},
	BatchReporting:       {BatchCompleted, BatchFailed},
	BatchFailed:          {BatchUpdateReporting, BatchDeleted},
	BatchUpdateReporting: {BatchCompleted, BatchFailed},
}

// ErrIllegalTransition is wrapped by the error of a transition the state
// machine does not allow. Such a transition changes nothing.
var ErrIllegalTransition = errors.New("ingest: illegal state transition")

// JobTransitionAllowed reports whether a job may move from one state to
// another. The empty state is Pending (a job that never ran).
func JobTransitionAllowed(from, to JobState) bool {
	if from == "" {
		from = JobPending
	}
	return slices.Contains(jobTransitions[from], to)
}

// BatchTransitionAllowed reports whether a batch may move from one state to
// another. The empty state is Pending.
func BatchTransitionAllowed(from, to BatchState) bool {
	if from == "" {
		from = BatchPending
	}
	return slices.Contains(batchTransitions[from], to)
}

// maxHistory bounds the transitions a progress remembers.
const maxHistory = 64

// Transition records one state change.
type Transition struct {
	From string    `json:"from"`
	To   string    `json:"to"`
	At   time.Time `json:"at"`
}

// JobProgress is the state of a job, checkpointed in its task's progress
// after every stage. A retried, taken-over or requeued job resumes from it.
type JobProgress struct {
	// Status is the Merritt state: the stage to do next (or being done).
	Status JobState `json:"status"`
	// LastSuccessfulStatus is the state the job last left for a state
	// other than Failed or Deleted. A requeue resumes at its
	// successor.
	LastSuccessfulStatus JobState `json:"last_successful_status,omitempty"`
	// RetryCount counts admin requeues.
	RetryCount int `json:"retry_count"`
	// LastModified is when the state last changed.
	LastModified time.Time `json:"last_modified"`
	// SpaceNeeded is the estimated payload size in bytes (unknown sizes
	// count 0), then the downloaded size.
	SpaceNeeded int64 `json:"space_needed"`
	// WorkDir is the job's working directory.
	WorkDir string `json:"work_dir,omitempty"`
	// Downloaded records the files downloaded and verified so far, by
	// name, so that a resumed download skips them.
	Downloaded map[string]FileResult `json:"downloaded,omitempty"`
	// Identifier is the object's primary identifier, given by the
	// manifest or minted once in processing.
	Identifier string `json:"identifier,omitempty"`
	// Minted is set when Identifier was minted by this job.
	Minted bool `json:"minted,omitempty"`
	// Reused is set when Identifier was found by the object's local id:
	// the job stores a new version of an object ingested before.
	Reused bool `json:"reused,omitempty"`
	// Version is the object version in storage, fixed before the first
	// file is stored so that a retried stage overwrites, never adds.
	Version int `json:"version,omitempty"`
	// StoragePath is the object version's directory in storage.
	StoragePath string `json:"storage_path,omitempty"`
	// Note says what a waiting stage waits for (provisioning).
	Note string `json:"note,omitempty"`
	// Error is the reason of the last failure.
	Error string `json:"error,omitempty"`
	// ErrorCode is the machine-readable reason of the last failure.
	ErrorCode string `json:"error_code,omitempty"`
	// FailedStage is the stage the last failure happened in.
	FailedStage JobState `json:"failed_stage,omitempty"`
	// FailRequested is set by an admin's forced fail of a job that is not
	// running: its next run fails at once.
	FailRequested bool `json:"fail_requested,omitempty"`
	// History holds the latest state changes, oldest first.
	History []Transition `json:"history,omitempty"`
}

// FileResult is a downloaded and verified file.
type FileResult struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// state returns the job's state, Pending when it never ran.
func (p *JobProgress) state() JobState {
	if p.Status == "" {
		return JobPending
	}
	return p.Status
}

// Transition moves the job to state to, keeping last_successful_status and
// the history as Merritt does: every move is appended to the history, and
// a move between two states neither of which is Failed or Deleted records
// the state it left as the last successful one. An illegal transition
// returns an error wrapping ErrIllegalTransition and changes nothing.
func (p *JobProgress) Transition(to JobState, now time.Time) error {
	from := p.state()
	if !JobTransitionAllowed(from, to) {
		return fmt.Errorf("%w: job %s -> %s", ErrIllegalTransition, from, to)
	}
	if to != JobFailed && to != JobDeleted && from != JobFailed && from != JobDeleted {
		p.LastSuccessfulStatus = from
	}
	p.Status = to
	p.LastModified = now
	p.History = appendHistory(p.History, Transition{From: string(from), To: string(to), At: now})
	return nil
}

// Requeue moves a Failed job to the successor of its last successful state
// (none, Pending or Held: Estimating) and adds one to its retry count. It
// changes nothing and returns an error wrapping ErrIllegalTransition when
// the job is not Failed.
func (p *JobProgress) Requeue(now time.Time) error {
	if p.state() != JobFailed {
		return fmt.Errorf("%w: requeue of a job that is %s, not Failed", ErrIllegalTransition, p.state())
	}
	next := JobEstimating
	switch lss := p.LastSuccessfulStatus; lss {
	case "", JobPending, JobHeld:
	default:
		succ, ok := jobSuccessor[lss]
		if !ok || succ == JobCompleted {
			return fmt.Errorf("%w: requeue of a job whose last successful state is %s", ErrIllegalTransition, lss)
		}
		next = succ
	}
	if err := p.Transition(next, now); err != nil {
		return err
	}
	p.RetryCount++
	p.Error, p.ErrorCode, p.FailRequested, p.Note = "", "", false, ""
	return nil
}

// BatchProgress is the state of a batch, checkpointed in its task's
// progress.
type BatchProgress struct {
	// Status is the Merritt state.
	Status BatchState `json:"status"`
	// LastModified is when the state last changed.
	LastModified time.Time `json:"last_modified"`
	// Jobs is the number of jobs the batch spawned.
	Jobs int `json:"jobs"`
	// Report is the latest report, made when the batch's last job ended.
	Report *Report `json:"report,omitempty"`
	// Reports counts the reports made (more than one after re-reporting).
	Reports int `json:"reports,omitempty"`
	// Notices are the notifications sent to the depositor, or that
	// failed, oldest first.
	Notices []Notice `json:"notices,omitempty"`
	// History holds the latest state changes, oldest first.
	History []Transition `json:"history,omitempty"`
}

// state returns the batch's state, Pending when it never ran.
func (p *BatchProgress) state() BatchState {
	if p.Status == "" {
		return BatchPending
	}
	return p.Status
}

// Transition moves the batch to state to. An illegal transition returns an
// error wrapping ErrIllegalTransition and changes nothing.
func (p *BatchProgress) Transition(to BatchState, now time.Time) error {
	from := p.state()
	if !BatchTransitionAllowed(from, to) {
		return fmt.Errorf("%w: batch %s -> %s", ErrIllegalTransition, from, to)
	}
	p.Status = to
	p.LastModified = now
	p.History = appendHistory(p.History, Transition{From: string(from), To: string(to), At: now})
	return nil
}

func appendHistory(h []Transition, t Transition) []Transition {
	h = append(h, t)
	if len(h) > maxHistory {
		h = slices.Clone(h[len(h)-maxHistory:])
	}
	return h
}
