package replication

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// A server stops at once while a continuous replication runs: the run is
// preemptible, so it checkpoints and hands its task back rather than keep
// the stop waiting for its whole grace period (a continuous replication
// never ends by itself). The replication polls once a minute, and the stop
// has a grace period of a minute too: a stop that waited for either would
// end with its context done.
func TestStopDoesNotWaitForAContinuousReplication(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.makeTables("items", 1_000)
	cfg := testConfig(e.st.Pool())
	cfg.PollInterval = time.Minute
	srv := e.server("stopping", cfg)
	f := submit(t, e.ctx, srv, e.params("items"), true)
	waitFor(t, 30*time.Second, "the replication to catch up", func() bool { return e.equal("items", "", "items") })
	task, _ := progress(t, e.ctx, srv, f.ID())
	require.Equal(t, StateRunning, StateOf(task))
	attempt := task.Attempt

	grace, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, srv.Stop(grace))
	require.NoError(t, grace.Err(), "Stop waited for the continuous replication until its grace period ended")

	reg := spi.NewRegistry()
	require.NoError(t, Register(reg, cfg))
	client, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	task, prog := progress(t, e.ctx, client, f.ID())
	require.Equal(t, api.StatusScheduled, task.Status, "the task is handed back, due again")
	require.Equal(t, attempt-1, task.Attempt, "the stopped run does not count as an attempt")
	var head int64
	require.NoError(t, e.src.QueryRow(e.ctx, `SELECT max(`+e.params("items").ChangeColumn+`) FROM items`).Scan(&head))
	require.Equal(t, head, prog.Seq, "the run checkpointed where it was")
}
