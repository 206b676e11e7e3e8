package impl_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// Runs claimed together are queued for the workers, which take them until
// the queue is empty: a run that blocks must not hold up the runs queued
// behind it. Every run of a batch of blocking runs starts.
func TestBlockedRunsHoldUpNoQueuedRun(t *testing.T) {
	t.Parallel()
	e := setup(t)
	b := &blocker{kind: api.Kind[KeyParams, struct{}]{ID: "test.blocked"}, log: newRunLog()}
	srv := e.blockerServer("node", b)
	const n = 200
	reqs := make([]api.SubmitRequest, n)
	for i := range reqs {
		reqs[i] = api.SubmitRequest{Behavior: b.kind.ID, Params: fmt.Appendf(nil, `{"key":"k%d"}`, i)}
	}
	_, err := srv.SubmitMany(e.ctx, reqs)
	require.NoError(t, err)
	waitFor(t, time.Minute, "every run to start", func() bool {
		cur := 0
		b.log.read(func(l *runLog) { cur = l.cur })
		return cur == n
	})
	require.Equal(t, n, srv.Running())
}
