package store

import (
	"context"

	"github.com/stinthq/stint/api"
)

// TaskWaits are the waits of runs on tasks that are not their children
// (spi.WaitForTasks): the run sleeps, holding neither worker nor lease,
// until every one of the tasks ended for good.
type TaskWaits interface {
	// WaitTasks registers the wait of the run r on the tasks ids
	// (distinct, r's own task not among them), before the run's
	// completion (Completion.WaitTasks) records the sleep. It returns how
	// many of them have not ended for good: each one's end counts off
	// the wait, and the last one's makes the task due, once it sleeps or
	// as its completion is recorded. Tasks that ended for good count as
	// ended at once. When some of ids do not exist it stores nothing and
	// returns them in missing. api.ErrHalt, storing nothing, when the
	// lease no longer holds.
	WaitTasks(ctx context.Context, r LeaseRef, ids []api.TaskID) (pending int, missing []api.TaskID, err error)
}
