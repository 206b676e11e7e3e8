package impl_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// lostAnswerStore is a store whose first claim that takes tasks of its
// behavior commits and then fails as if its answer outran its deadline:
// the tasks are claimed, and the node never reads them.
type lostAnswerStore struct {
	store.Store
	behavior api.BehaviorID
	lost     atomic.Int32 // the tasks of the claim whose answer was lost
}

func (s *lostAnswerStore) Claim(ctx context.Context, req store.ClaimRequest) ([]store.Claimed, error) {
	out, err := s.Store.Claim(ctx, req)
	if err == nil && len(out) > 0 && out[0].Behavior == s.behavior && s.lost.CompareAndSwap(0, int32(len(out))) {
		return nil, fmt.Errorf("read claimed tasks: %w", context.DeadlineExceeded)
	}
	return out, err
}

// TestAClaimWhoseAnswerIsLostGivesItsTasksBack: a claim that committed
// and whose rows the node could not read leaves no task running on no
// node until its lease expires: the node gives them back at once, and
// they run without the lost claim counting as an attempt.
func TestAClaimWhoseAnswerIsLostGivesItsTasksBack(t *testing.T) {
	t.Parallel()
	e := setup(t)
	register := func(reg *spi.Registry) { spi.MustRegister[bulkyParams, struct{}](reg, bulky{}) }
	st := &lostAnswerStore{Store: e.st, behavior: bulkyKind.ID}
	reg := testRegistry(e.pool, "client", time.Second)
	register(reg)
	c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	g := newGate(t)
	openGate(g)
	const n = 4
	reqs := make([]api.SubmitRequest, n)
	for i := range reqs {
		reqs[i] = api.SubmitRequest{Behavior: bulkyKind.ID, Params: mustJSON(bulkyParams{Blob: strings.Repeat("x", 100<<10), Gate: g})}
	}
	_, err = c.SubmitMany(e.ctx, reqs)
	require.NoError(t, err)

	const lease = 30 * time.Second
	srvReg := testRegistry(e.pool, "n1", lease)
	register(srvReg)
	srv, err := impl.NewServer(st, impl.ServerConfig{Node: "n1", Registry: srvReg, PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, srv.Start(e.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	started := time.Now()
	waitFor(t, lease/3, "the tasks of the lost claim run, long before its lease would expire", func() bool {
		return e.count(`SELECT count(*) FROM stint_task WHERE behavior = $1 AND status = 'success'`, string(bulkyKind.ID)) == n
	})
	require.Positive(t, st.lost.Load(), "a claim's answer was lost")
	require.Equal(t, n, e.count(`SELECT count(*) FROM stint_task WHERE behavior = $1 AND attempt = 1`, string(bulkyKind.ID)),
		"the lost claim counts no attempt")
	t.Logf("the tasks ran %s after the node started", time.Since(started).Round(time.Millisecond))
}
