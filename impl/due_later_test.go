package impl_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// A task due a moment after its submit starts when it falls due, not at
// the claimers' next poll: the submitter kicks the claimers then. The
// server polls once an hour here, so a task left to the poll never runs
// within the test's deadline. Each case goes through another door: a
// client's Submit and SubmitMany (the notification reaches the server), the
// server's own Submit (its claimers are woken in-process), and a retry
// after a backoff (the server that recorded the failure kicks).
func TestTaskDueLaterStartsWhenDue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", time.Minute, func(cfg *impl.ServerConfig) { cfg.PollInterval = time.Hour })
	c := e.client()
	const delay = 200 * time.Millisecond

	cases := []struct {
		name   string
		submit func(p WorkParams) (api.TaskID, error)
	}{
		{"client submit", func(p WorkParams) (api.TaskID, error) {
			f, err := api.Submit(e.ctx, c, workKind, p, api.WithDelay(delay))
			return f.ID(), err
		}},
		{"client submit many", func(p WorkParams) (api.TaskID, error) {
			req := workReq(workKind, p)
			req.Delay = delay
			subs, err := c.SubmitMany(e.ctx, []api.SubmitRequest{req})
			if err != nil {
				return "", err
			}
			return subs[0].ID, nil
		}},
		{"server submit", func(p WorkParams) (api.TaskID, error) {
			f, err := api.Submit(e.ctx, srv, workKind, p, api.WithDelay(delay))
			return f.ID(), err
		}},
		{"retry after a backoff", func(p WorkParams) (api.TaskID, error) {
			p.FailUntil = 1 // test.work retries after 20 to 50 ms
			f, err := api.Submit(e.ctx, c, workKind, p)
			return f.ID(), err
		}},
	}
	for _, tc := range cases {
		submitted := time.Now()
		id, err := tc.submit(WorkParams{Key: tc.name})
		require.NoError(t, err, tc.name)
		waitFor(t, 20*time.Second, tc.name+": the task's success", func() bool {
			task, err := c.Get(e.ctx, id)
			require.NoError(t, err)
			return task.Status == api.StatusSuccess
		})
		if tc.name != "retry after a backoff" {
			require.GreaterOrEqual(t, time.Since(submitted), delay, "%s: it started before it was due", tc.name)
		}
	}
	require.Equal(t, 2, e.count(`SELECT count(*) FROM test_run WHERE task_id = $1`,
		string(spi.NewIDs(workKind.ID).Deterministic("retry after a backoff"))), "the retry ran")
}
