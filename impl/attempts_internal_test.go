package impl

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// A task's page shows the failed runs of its current attempts, not the
// rows left from before its attempts started over.
func TestCurrentAttempts(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	at := func(s int) *time.Time { v := base.Add(time.Duration(s) * time.Second); return &v }
	row := func(attempt, ended int) api.Attempt { return api.Attempt{Attempt: attempt, EndedAt: *at(ended)} }
	attempts := func(rows []api.Attempt) []int {
		var out []int
		for _, a := range rows {
			out = append(out, a.Attempt)
		}
		return out
	}
	for _, c := range []struct {
		name string
		task api.Task
		rows []api.Attempt
		want []int
	}{
		{"two failures, the third run going",
			api.Task{Status: api.StatusRunning, Attempt: 3, ExecutedAt: at(30)},
			[]api.Attempt{row(1, 10), row(2, 20)}, []int{1, 2}},
		{"three failures, the last for good",
			api.Task{Status: api.StatusFailure, Attempt: 3, ExecutedAt: at(25), FinishedAt: at(30)},
			[]api.Attempt{row(1, 10), row(2, 20), row(3, 30)}, []int{1, 2, 3}},
		{"failures then a success",
			api.Task{Status: api.StatusSuccess, Attempt: 3, ExecutedAt: at(25), FinishedAt: at(30)},
			[]api.Attempt{row(1, 10), row(2, 20)}, []int{1, 2}},
		{"the second run lost with its node",
			api.Task{Status: api.StatusFailure, Attempt: 3, ExecutedAt: at(25), FinishedAt: at(30)},
			[]api.Attempt{row(1, 10), row(3, 30)}, []int{1, 3}},
		{"started over, the first run going: the old rows are left out",
			api.Task{Status: api.StatusRunning, Attempt: 1, ExecutedAt: at(100)},
			[]api.Attempt{row(1, 10), row(2, 20), row(3, 30)}, nil},
		{"started over, its first run failed and its second succeeded",
			api.Task{Status: api.StatusSuccess, Attempt: 2, ExecutedAt: at(110), FinishedAt: at(120)},
			[]api.Attempt{row(1, 105), row(2, 20), row(3, 30)}, []int{1}},
		{"started over, waiting to run",
			api.Task{Status: api.StatusScheduled, Attempt: 0},
			[]api.Attempt{row(1, 10), row(2, 20)}, nil},
		{"a failure waiting for its retry, failed by hand",
			api.Task{Status: api.StatusFailure, Attempt: 2, ExecutedAt: at(15), FinishedAt: at(60)},
			[]api.Attempt{row(1, 10), row(2, 20)}, []int{1, 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, c.want, attempts(currentAttempts(c.task, c.rows)))
		})
	}
}
