package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// debounceSQL stores one debounced task (store.NewTask.Debounce; the
// semantics are api.Debounce's): submitSQL's insert, whose conflict clause
// moves the due time of a task waiting for its next run, or the due time
// of the run again of a running one, to the earlier of the window's end
// (the delay, $5) and the deadline of its debounce cycle, and replaces the
// params of a waiting task ($3, combined before if the behavior combines).
// Its parameters are submitSQL's without $11: the wake flag as $11, the
// rate uses and version as $12 and $13, the maximum wait in microseconds
// as $14.
//
// The cycle is the task's debounce_since and debounce_deadline. It holds
// (debounceLive) unless the task finished for good or ran since: a run
// that started after the cycle began sets executed_at later than
// debounce_since. (A run that ended resubmitted, snoozed or lost clears
// executed_at: the cycle holds then, being the one begun during the run
// or one whose run did not end.) Otherwise the submit begins another
// cycle, from clock_timestamp(): read once the statement holds the row,
// so later than the start of any run it sees. (A claim whose clock was
// read before a cycle began and that took the task after it, a race of
// microseconds, leaves the cycle holding through the run: the run again
// is due at that cycle's deadline at the latest, never later.) A held
// task keeps its cycle as it keeps its due time.
var debounceSQL = `
WITH s AS (
INSERT INTO stint_task AS t (` + insertColumns + `, debounce_since, debounce_deadline)
SELECT ` + insertValues + `, clock_timestamp(), now() + r.max_wait_us * interval '1 microsecond'
FROM ` + unnestRows("r", append(insertArrays(12), "max_wait_us $14::bigint[]")...) + `
` + resubmitClause(debouncePending, `least(excluded.schedule_not_before, `+debounceDeadline+`)`,
	`    debounce_since = CASE WHEN t.status = 'held' OR `+debounceLive+` THEN t.debounce_since ELSE clock_timestamp() END,
    debounce_deadline = CASE WHEN t.status = 'held' THEN t.debounce_deadline ELSE `+debounceDeadline+` END,
`) + `
)` + recordSubmitChanges("$11", false)

const (
	// debouncePending is the condition under which the existing task t
	// waits for its next run: scheduled, or due again after a run.
	debouncePending = `(t.status = 'scheduled' OR (t.status IN ('success', 'failure') AND t.schedule_not_before IS NOT NULL))`
	// debounceLive is the condition under which t's debounce cycle holds.
	debounceLive = `(t.debounce_deadline IS NOT NULL AND NOT ` + finishedForGood + `
        AND (t.executed_at IS NULL OR t.debounce_since > t.executed_at))`
	// debounceDeadline is the deadline of the cycle a debounced submit of
	// t belongs to: t's own, or the one the submit begins.
	debounceDeadline = `CASE WHEN ` + debounceLive + ` THEN t.debounce_deadline ELSE excluded.debounce_deadline END`
)

// debounce runs debounceSQL for t on q.
func debounce(ctx context.Context, q batcher, t store.NewTask) ([]api.Submission, error) {
	got := map[api.TaskID]api.Submission{t.ID: {ID: t.ID}}
	cols := newSubmitColumns(1, false)
	cols.add(t, false)
	args := append(cols.args(), cols.wake, cols.rateUses, cols.versions, intArray{t.Debounce.MaxWait.Microseconds()})
	if _, err := indexed(ctx, q, func(rows pgx.Rows) error { return collectSubmissions(rows, got, nil) }, debounceSQL, args...); err != nil {
		return nil, err
	}
	return []api.Submission{got[t.ID]}, nil
}

// combinesDebounced reports whether a debounced submit combines its
// params with those of a task of the status and due time read by
// combineLockSQL: one that waits for its next run (see debouncePending).
func combinesDebounced(status string, due bool) bool {
	switch api.Status(status) {
	case api.StatusScheduled:
		return true
	case api.StatusSuccess, api.StatusFailure:
		return due
	}
	return false
}
