package failover

import (
	"context"
	"github.com/stinthq/stint/internal/chaos"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgcluster"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store/postgres"
)

// replicated starts a primary of the test's own, with a database "stint"
// migrated, and a streaming standby of it (synchronous when sync: every
// commit waits for the standby to flush it), and returns them with the
// multi-host URL of both that asks for the read-write one.
func replicated(t *testing.T, sync bool) (primary, standby *pgcluster.Cluster, dsn string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	primary = chaos.Server(t, ctx)
	standby, err := primary.StartStandby(ctx, pgtest.TempDir(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = standby.Stop() })
	require.NoError(t, pgcluster.WaitReplayed(ctx, primary.DSN("postgres"), standby.DSN("postgres")))
	if sync {
		conn, err := pgx.Connect(ctx, primary.DSN("postgres"))
		require.NoError(t, err)
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = '*'`)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `SELECT pg_reload_conf()`)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			var n int
			err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'`).Scan(&n)
			return err == nil && n == 1
		}, time.Minute, 50*time.Millisecond, "the standby should become synchronous")
	}
	dsn = "postgres://postgres@127.0.0.1:" + strconv.Itoa(primary.Port()) + ",127.0.0.1:" + strconv.Itoa(standby.Port()) +
		"/stint?sslmode=disable&target_session_attrs=read-write"
	return primary, standby, dsn
}

// promoteAfter stands for the failover manager's detection of a dead
// primary: the tests promote the standby this long after killing it.
const promoteAfter = 2 * time.Second

func TestFailoverToAPromotedStandby(t *testing.T) {
	t.Parallel() // on clusters of its own: beside the other failover tests, once the shared cluster's are done
	primary, standby, dsn := replicated(t, true)
	c := chaos.NewClusterAt(t, dsn)
	c.StartAll()
	// The nodes meet it as unreachable, shutdown or recovery, as it comes.
	c.Incident("failover (the synchronous standby promoted after the primary's SIGKILL)", chaos.IncidentFor(promoteAfter),
		func() { require.NoError(t, primary.Kill()) },
		func() { require.NoError(t, standby.Promote(c.Ctx)) })
}

func TestRecoveryMode(t *testing.T) {
	t.Parallel() // on clusters of its own: beside the other failover tests, once the shared cluster's are done
	primary, standby, dsn := replicated(t, true)
	c := chaos.NewClusterAt(t, dsn)
	p, err := chaos.NewProxy("127.0.0.1:" + strconv.Itoa(primary.Port()))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	u, err := url.Parse(primary.DSN("stint"))
	require.NoError(t, err)
	u.Host = p.Addr()
	for _, n := range c.Nodes {
		n.DSN = u.String() // one host, whatever server answers there
	}
	c.StartAll()
	// A client pointed at the standby alone.
	st, err := postgres.Open(c.Ctx, standby.DSN("stint"))
	require.NoError(t, err)
	t.Cleanup(st.Close)
	onStandby, err := impl.NewClient(st, impl.ClientConfig{Registry: chaos.Registry(st.Pool(), "standby")})
	require.NoError(t, err)
	t.Cleanup(onStandby.Close)
	var refused error
	c.Incident("recovery mode", chaos.IncidentFor(5*time.Second), func() {
		// The server behind the nodes' address restarts in recovery: a
		// standby now answers there.
		require.NoError(t, primary.Kill())
		p.Retarget("127.0.0.1:" + strconv.Itoa(standby.Port()))
		p.Cut()
		_, refused = onStandby.Submit(c.Ctx, api.SubmitRequest{Behavior: chaos.WorkKind.ID, Params: []byte(`{"n":2000000}`)})
	}, func() { require.NoError(t, standby.Promote(c.Ctx)) }, impl.CauseReadOnly)
	require.ErrorIs(t, refused, api.ErrReadOnly)
	t.Logf("the refused submit's error: %v", refused)
}
