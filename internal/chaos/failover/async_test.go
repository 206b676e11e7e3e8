package failover

import (
	"context"
	"github.com/stinthq/stint/internal/chaos"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// execOn runs statements on the server at dsn, each in a transaction of
// its own.
func execOn(t *testing.T, dsn string, stmts ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, q := range stmts {
		_, err := conn.Exec(ctx, q)
		require.NoError(t, err, q)
	}
}

// What asynchronous replication loses, checked: under load, the
// standby stops receiving WAL (as when it falls behind), the primary goes
// on acknowledging submits, then dies, and the standby is promoted. Every
// acknowledged task the promoted database lacks must have been
// acknowledged after the standby's last replayed position; every task it
// holds finishes, its finish lost or not, with no duplicate effect.
func TestAsyncFailoverLosesOnlyWhatFollowedTheReplay(t *testing.T) {
	t.Parallel() // on clusters of its own: beside the other failover tests, once the shared cluster's are done
	primary, standby, dsn := replicated(t, false)
	c := chaos.NewClusterAt(t, dsn)
	c.StartAll()
	l := chaos.NewLedger()
	stop := make(chan struct{})
	waited := make(chan func(), 1)
	go func() { waited <- c.Load(l, 0, stop) }()

	// The workload runs, replicated; then the standby stops receiving.
	time.Sleep(chaos.IncidentFor(2 * time.Second)) // the load's duration before the fault
	execOn(t, standby.DSN("postgres"), `ALTER SYSTEM SET primary_conninfo = ''`, `SELECT pg_reload_conf()`)
	ctx := c.Ctx
	sconn, err := pgx.Connect(ctx, standby.DSN("postgres"))
	require.NoError(t, err)
	defer sconn.Close(context.Background())
	require.Eventually(t, func() bool {
		var n int
		return sconn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_wal_receiver`).Scan(&n) == nil && n == 0
	}, time.Minute, 50*time.Millisecond, "the standby's WAL receiver should stop")
	before := len(l.Acked())
	// The primary acknowledges what the standby never gets.
	require.Eventually(t, func() bool { return len(l.Acked()) >= before+100 }, time.Minute, 20*time.Millisecond,
		"the primary should go on acknowledging submits")

	// The standby has replayed all it received: the position below is
	// all the promoted database holds of the old primary's history. The
	// receiver's stop may cut the last record it received short, a record
	// never replayed (nor kept by the promotion): then the startup process
	// waits for WAL from any source once it replayed the rest.
	var replayed string
	require.Eventually(t, func() bool {
		var done bool
		err := sconn.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()
			OR EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'startup' AND wait_event = 'RecoveryRetrieveRetryInterval'),
			pg_last_wal_replay_lsn()::text`).Scan(&done, &replayed)
		return err == nil && done
	}, time.Minute, 20*time.Millisecond, "the standby should replay what it received")
	replay, err := chaos.ParseLSN(replayed)
	require.NoError(t, err)
	killed := time.Now()
	require.NoError(t, primary.Kill())
	time.Sleep(promoteAfter) // the failover manager's detection
	require.NoError(t, standby.Promote(ctx))
	promoted := time.Now()
	// Submits go on against the promoted database.
	require.Eventually(t, func() bool { return len(l.Acked()) >= before+300 }, 2*time.Minute, 50*time.Millisecond,
		"submits should be acknowledged again after the promotion")
	close(stop)
	wait := <-waited

	stored := c.Stored()
	var lost []api.TaskID
	for _, id := range l.Acked() {
		if !stored[id] {
			lost = append(lost, id)
			require.Greater(t, l.LSN[id], replay,
				"task %s was acknowledged before the standby's replayed position %s, and is lost", id, replayed)
		}
	}
	require.NotEmpty(t, lost, "the submits acknowledged after the standby stopped receiving should be lost")
	r := c.Check(chaos.Keys(stored))
	wait()
	told := c.ToldThenLost(l)
	t.Logf("measured: asynchronous failover: acknowledged=%d lost=%d (all after the replayed position %s) stored=%d %s; "+
		"awaited=%d of which told a result then lost=%d; first run %s after the promotion (%s after the kill)",
		len(l.Acked()), len(lost), replayed, len(stored), r, len(l.Awaited), len(told),
		c.FirstRunAfter(promoted).Round(time.Millisecond), promoted.Sub(killed).Round(time.Millisecond))
	require.Zero(t, r.Lost, "stored tasks that did not finish")
	require.Zero(t, r.Duplicated, "duplicated effects")
	require.Zero(t, r.Unexpected, "unexpected results")
}
