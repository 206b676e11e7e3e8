package spi

import (
	"strconv"
	"time"

	"github.com/stinthq/stint/api"
)

// MaxWaitTasks is the most tasks one WaitForTasks may name.
const MaxWaitTasks = 10_000

// WaitTasksError is returned by Run (via WaitForTasks) to release its
// worker until every task of IDs ended for good.
type WaitTasksError struct {
	// IDs are the tasks waited on.
	IDs []api.TaskID
	// Max is the longest wait: the task runs again after it even if some
	// of IDs have not ended.
	Max time.Duration
}

func (e *WaitTasksError) Error() string {
	return "wait for " + strconv.Itoa(len(e.IDs)) + " tasks (at most " + e.Max.String() + ")"
}

// WaitForTasks returns the error a run returns to sleep, holding neither
// worker nor lease, until every task of ids ended for good (succeeded or
// failed, no run left), or max passes: any tasks, not only the run's
// children (a node of another workflow, a task submitted elsewhere). The
// finish of the last of them makes the task due, once, in the
// transaction that records it; tasks that ended already count as ended at
// once, so with none left to wait for the task is due at once. A task
// removed while waited on counts as ended too. The next run reads their
// outcomes (Tasks.Get) and decides. Like a snooze, the wait is neither a
// failure nor an attempt.
//
// ids must name at most MaxWaitTasks existing tasks (repeats count once),
// not the run's own; none at all runs the task again at once. An id of no
// task fails the run with the code CodeWaitNotFound, and bad ids
// (malformed, too many, the run's own) with CodeInvalidWait, neither
// retried unless the behavior decides its retries itself
// (FailureRescheduler), and nothing is waited on.
func WaitForTasks(ids []api.TaskID, max time.Duration) error {
	return &WaitTasksError{IDs: ids, Max: max}
}

// Error codes (api.TaskError.Code) of runs whose WaitForTasks could not
// wait.
const (
	// CodeWaitNotFound: a task waited on does not exist (api.ErrNotFound).
	CodeWaitNotFound = "not_found"
	// CodeInvalidWait: the ids waited on are malformed, too many, or name
	// the run's own task.
	CodeInvalidWait = "invalid_wait"
)
