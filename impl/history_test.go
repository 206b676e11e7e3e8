package impl_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
)

// historyTotals sums the run ends of behavior over the history's points,
// and tells whether any point of it was sampled.
func historyTotals(t *testing.T, e *env, behavior api.BehaviorID) (succeeded, failed, retried int64, sampled bool) {
	t.Helper()
	h, err := e.client().History(e.ctx, time.Hour)
	require.NoError(t, err)
	for _, p := range h.Points {
		if p.Behavior == behavior {
			succeeded, failed, retried = succeeded+p.Succeeded, failed+p.Failed, retried+p.Retried
			sampled = sampled || p.Sampled
		}
	}
	return succeeded, failed, retried, sampled
}

// A server counts its runs' ends in memory and adds them to the history in
// the database: at the latest when it stops, so that the counts survive
// it, and every HistoryInterval, when it also samples the backlog.
func TestHistoryKeepsRunEndsAcrossARestart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	first := e.server("history-1", 5*time.Second, func(c *impl.ServerConfig) { c.Maintenance.HistoryInterval = time.Hour })

	for _, key := range []string{"a", "b", "c"} {
		e.run(first, WorkParams{Key: key})
	}
	e.run(first, WorkParams{Key: "flaky", FailUntil: 1}) // fails, is retried, succeeds
	f, err := api.Submit(e.ctx, first, workKind, WorkParams{Key: "doomed", Permanent: true, FailUntil: 1})
	require.NoError(t, err)
	_, err = f.Await(e.ctx)
	require.Error(t, err)

	s, fl, r, _ := historyTotals(t, e, workKind.ID)
	require.Zero(t, s+fl+r, "nothing is recorded before the first interval")
	require.NoError(t, first.Stop(e.ctx))
	s, fl, r, _ = historyTotals(t, e, workKind.ID)
	require.Equal(t, []int64{4, 2, 1}, []int64{s, fl, r}, "succeeded, failed, retried, recorded when the server stopped")

	second := e.server("history-2", 5*time.Second, func(c *impl.ServerConfig) { c.Maintenance.HistoryInterval = 50 * time.Millisecond })
	e.run(second, WorkParams{Key: "d"})
	waitFor(t, 30*time.Second, "the next server's run and sample in the history", func() bool {
		s, fl, r, sampled := historyTotals(t, e, workKind.ID)
		return s == 5 && fl == 2 && r == 1 && sampled
	})
}
