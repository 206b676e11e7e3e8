package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestNewStandby checks that the standby is a hot standby of the database,
// that it replays what the primary commits, and that pausing its replay
// keeps it at the old state until it is resumed.
func TestNewStandby(t *testing.T) {
	primaryDSN, standbyDSN, _ := NewStandby(t)
	primary, standby := connect(t, primaryDSN), connect(t, standbyDSN)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var recovering bool
	require.NoError(t, standby.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering))
	require.True(t, recovering, "the standby should be in recovery")
	require.NoError(t, primary.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering))
	require.False(t, recovering, "the primary should not be in recovery")
	requireMigrated(t, standby)

	count := func() int {
		var n int
		require.NoError(t, standby.QueryRow(ctx, "SELECT count(*) FROM stint_node").Scan(&n))
		return n
	}
	insert := func(id string) {
		_, err := primary.Exec(ctx, `INSERT INTO stint_node (id, host, pid, behaviors, max_workers) VALUES ($1, 'h', 1, '{}', 1)`, id)
		require.NoError(t, err)
	}
	insert("n1")
	CatchUp(t, primaryDSN, standbyDSN)
	require.Equal(t, 1, count())

	_, err := standby.Exec(ctx, "SELECT pg_wal_replay_pause()")
	require.NoError(t, err)
	insert("n2")
	// The primary has written n2; a paused standby has received it but
	// shows the old state.
	for {
		var received bool
		require.NoError(t, standby.QueryRow(ctx, "SELECT pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn()").Scan(&received),
			"the standby should receive the insert")
		if received {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling a condition; ctx is the deadline
	}
	require.Equal(t, 1, count())

	_, err = standby.Exec(ctx, "SELECT pg_wal_replay_resume()")
	require.NoError(t, err)
	CatchUp(t, primaryDSN, standbyDSN)
	require.Equal(t, 2, count())
}
