package replication

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// The lag is shown only when a checkpoint measured it, and while a
// replication runs only when its current run did.
func TestInfoLagKnownOrUnknown(t *testing.T) {
	t.Parallel()
	read := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	healthy := read.Add(-time.Minute)
	cases := []struct {
		name   string
		status api.Status
		prog   *Progress
		known  bool
		lag    int64
		text   string
	}{
		{"no progress", api.StatusRunning, nil, false, 0, "unknown"},
		{"never read the source", api.StatusRunning, &Progress{HealthySince: &healthy}, false, 0, "unknown"},
		{"running, measured by this run", api.StatusRunning,
			&Progress{Result: Result{Seq: 500}, SourceSeq: 5000, SourceSeqAt: read, HealthySince: &healthy}, true, 4500, "4500 (10s ago)"},
		{"running, only an earlier run measured", api.StatusRunning,
			&Progress{Result: Result{Seq: 500}, SourceSeq: 500, SourceSeqAt: read}, false, 0, "unknown"},
		{"stopped: the last run's measure", api.StatusScheduled,
			&Progress{Result: Result{Seq: 500}, SourceSeq: 700, SourceSeqAt: read}, true, 200, "200 (10s ago)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			task := api.Task{ID: "r", Behavior: ContinuousBehavior, Status: c.status, Params: json.RawMessage(`{}`)}
			if c.prog != nil {
				raw, err := json.Marshal(c.prog)
				require.NoError(t, err)
				task.Progress = raw
			}
			info := InfoOf(task)
			require.Equal(t, c.known, info.LagKnown)
			require.Equal(t, c.lag, info.Lag)
			require.Equal(t, c.text, info.LagText(read.Add(10*time.Second)))
		})
	}
}

// A progress without a checkpoint has no zero times in its JSON.
func TestProgressOmitsZeroTimes(t *testing.T) {
	t.Parallel()
	raw, err := json.Marshal(Progress{Errors: 1, LastError: "source unreachable"})
	require.NoError(t, err)
	require.NotContains(t, string(raw), "0001-01-01")
	require.NotContains(t, string(raw), "checkpointed_at")
}

// A continuous replication shows its lag from its first batch on, not from
// its first checkpoint interval on: here the interval is a minute, and the
// lag must be known well before.
func TestContinuousReplicationShowsLagEarly(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const rows = 5_000
	e.makeTables("items", rows)
	var head int64
	require.NoError(t, e.src.QueryRow(e.ctx, `SELECT max(`+e.params("items").ChangeColumn+`) FROM items`).Scan(&head))
	cfg := testConfig(e.st.Pool())
	cfg.CheckpointInterval = time.Minute
	srv := e.server("lagging", cfg)
	f := submit(t, e.ctx, srv, e.params("items"), true)
	var info Info
	waitFor(t, 30*time.Second, "a known lag", func() bool {
		task, err := srv.Get(e.ctx, f.ID())
		require.NoError(t, err)
		info = InfoOf(task)
		return info.LagKnown
	})
	require.Equal(t, StateRunning, info.State)
	require.Positive(t, info.Seq, "the first batch is checkpointed")
	require.Equal(t, head, info.Seq+info.Lag, "the lag is measured against the source's head")
	require.NotNil(t, info.LagAt)
	require.NoError(t, srv.Remove(e.ctx, f.ID()))
}
