package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// TestLeasesAreKeptWhileRunsHoldEveryConnection checks that a node whose
// runs hold every connection of its pool (a busy node: behaviors write
// through Pool) still renews its leases, takes over expired ones and
// beats its heartbeat: a renewal that waited for a connection would miss
// its deadline and cut its runs off.
func TestLeasesAreKeptWhileRunsHoldEveryConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := postgres.Open(ctx, pgtest.New(t), postgres.MaxConns(2))
	require.NoError(t, err)
	t.Cleanup(st.Close)
	require.NoError(t, st.RegisterNode(ctx, store.Node{ID: "n1", Host: "h", PID: 1}))
	submitT(t, ctx, st, store.NewTask{ID: "running"})
	cl := claimT(t, ctx, st, 1, 0)
	require.Len(t, cl, 1)

	// The runs take every connection of the pool.
	var held []*pgxpool.Conn
	for range 2 {
		c, err := st.Pool().Acquire(ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	// The bound stands for a renewal's deadline: far longer than the
	// statements take, and shorter than the wait for a connection that
	// is never released.
	bounded := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		t.Cleanup(cancel)
		return c
	}
	renewed, err := st.Renew(bounded(), []store.Renewal{{LeaseRef: cl[0].LeaseRef, Duration: time.Minute}})
	require.NoError(t, err, "a renewal waited for the runs' connections")
	require.True(t, renewed[cl[0].ID])
	_, _, err = st.Takeover(bounded(), 100)
	require.NoError(t, err, "a takeover waited for the runs' connections")
	require.NoError(t, st.HeartbeatNode(bounded(), "n1", store.NodeHealth{}), "a heartbeat waited for the runs' connections")
}
