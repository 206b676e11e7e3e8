package impl

// Waits on tasks (spi.WaitForTasks): the run registers its wait before its
// completion records the sleep; the store wakes it in the transaction
// that ends the last task it waits on (see store.TaskWaits).

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// waitTasks registers the wait of run r (decoded params p) on the tasks
// its outcome names, if it returned spi.WaitForTasks, and returns the
// outcome to record and whether it registered: the sleep, due at once
// when none of the tasks is left to wait for; a failure when the ids are
// bad (spi.CodeInvalidWait) or name no task (spi.CodeWaitNotFound). A run
// that lost its lease registers nothing (its completion is fenced out as
// ever); one whose registration the database refused sleeps no longer
// than a poll interval, to try again at its next run.
func (s *Server) waitTasks(r *run, p any, out spi.Outcome) (spi.Outcome, bool) {
	if out.WaitTasks == nil {
		return out, false
	}
	fail := func(code, format string, args ...any) (spi.Outcome, bool) {
		te := &api.TaskError{Code: code, Message: "wait for tasks: " + fmt.Sprintf(format, args...)}
		return r.reg.Fail(p, te, &r.rc, r.claimed.Errors), false
	}
	ids := slices.Clone(out.WaitTasks)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if len(ids) > spi.MaxWaitTasks {
		return fail(spi.CodeInvalidWait, "%d tasks is over the limit of %d", len(ids), spi.MaxWaitTasks)
	}
	for _, id := range ids {
		if err := spi.CheckTaskID("id", id); err != nil {
			return fail(spi.CodeInvalidWait, "%v", err)
		}
		if id == r.claimed.ID {
			return fail(spi.CodeInvalidWait, "a run cannot wait for its own task %s", id)
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), dbTimeout)
	defer cancel()
	pending, missing, err := s.st.WaitTasks(ctx, r.claimed.LeaseRef, ids)
	switch {
	case len(missing) > 1:
		return fail(spi.CodeWaitNotFound, "task %s and %d more: %v", missing[0], len(missing)-1, api.ErrNotFound)
	case len(missing) == 1:
		return fail(spi.CodeWaitNotFound, "task %s: %v", missing[0], api.ErrNotFound)
	case errors.Is(err, api.ErrHalt):
		out.WaitTasks = nil
		return out, false
	case err != nil:
		s.log.Warn("stint: registering a wait on tasks failed; the task runs again after a poll interval", "task", r.claimed.ID, "err", err)
		out.WaitTasks, out.Delay = nil, min(out.Delay, s.cfg.PollInterval)
		return out, false
	case pending == 0:
		out.Delay = 0
	}
	return out, true
}
