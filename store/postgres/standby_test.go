package postgres_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgcluster"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// standbyEnv is a store on a fresh database whose reads go to the test's
// own hot standby.
type standbyEnv struct {
	ctx                 context.Context
	st                  *postgres.Store
	primaryDSN, readDSN string
	standby             *pgcluster.Cluster
}

func openStandbyT(t *testing.T) standbyEnv {
	t.Helper()
	primaryDSN, readDSN, standby := pgtest.NewStandby(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	st, err := postgres.Open(ctx, primaryDSN, postgres.ReadDSN(readDSN))
	require.NoError(t, err)
	t.Cleanup(st.Close)
	require.True(t, st.HasStandby())
	return standbyEnv{ctx: ctx, st: st, primaryDSN: primaryDSN, readDSN: readDSN, standby: standby}
}

func taskIDs(page api.Page) []api.TaskID {
	ids := []api.TaskID{}
	for _, t := range page.Tasks {
		ids = append(ids, t.ID)
	}
	return ids
}

func statusCount(s store.Stats, status api.Status) int64 {
	var n int64
	for _, c := range s.Counts {
		if c.Status == status {
			n += c.Count
		}
	}
	return n
}

func eventsOf(events []api.Event, id api.TaskID) []api.Status {
	var out []api.Status
	for _, e := range events {
		if e.TaskID == id {
			out = append(out, e.Status)
		}
	}
	return out
}

// While the standby's replay is paused, List, Get, Stats and Changes show
// the state it had (which proves they are read on the standby), while
// submits and claims take effect on the primary, a Get of a task the
// standby lacks finds it there, and store.ReadPrimary reads the current
// state. Resumed, the standby shows the current state.
func TestStandbyServesReadsWhileWritesAndClaimsStayOnPrimary(t *testing.T) {
	t.Parallel()
	e := openStandbyT(t)
	ctx, st := e.ctx, e.st
	submitT(t, ctx, st, store.NewTask{ID: "task-a"})
	oldTick, err := st.FeedHead(ctx)
	require.NoError(t, err)
	pgtest.CatchUp(t, e.primaryDSN, e.readDSN)
	pgtest.PauseReplay(t, e.readDSN)

	submitT(t, ctx, st, store.NewTask{ID: "task-b"})
	page, err := st.List(ctx, api.Filter{})
	require.NoError(t, err)
	require.Equal(t, []api.TaskID{"task-a"}, taskIDs(page), "List reads the paused standby")
	page, err = st.List(store.ReadPrimary(ctx), api.Filter{})
	require.NoError(t, err)
	require.Equal(t, []api.TaskID{"task-a", "task-b"}, taskIDs(page), "ReadPrimary reads the primary")
	b, err := st.Get(ctx, "task-b")
	require.NoError(t, err, "a Get of a task the standby lacks asks the primary")
	require.Equal(t, api.StatusScheduled, b.Status)
	_, err = st.Get(ctx, "missing")
	require.ErrorIs(t, err, api.ErrNotFound)

	claimed := claimT(t, ctx, st, 10, 0)
	require.Len(t, claimed, 2, "claims run on the primary, which has both tasks")
	a, err := st.Get(ctx, "task-a")
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, a.Status, "Get reads the paused standby")
	a, err = st.Get(store.ReadPrimary(ctx), "task-a")
	require.NoError(t, err)
	require.Equal(t, api.StatusRunning, a.Status)

	stats, err := st.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), statusCount(stats, api.StatusScheduled), "Stats reads the paused standby")
	require.Zero(t, statusCount(stats, api.StatusRunning))
	stats, err = st.Stats(store.ReadPrimary(ctx))
	require.NoError(t, err)
	require.Equal(t, int64(2), statusCount(stats, api.StatusRunning))

	// A reader at a cursor the standby has sees nothing new yet; one at a
	// cursor only the primary has reads there rather than failing.
	events, next, err := st.Changes(ctx, store.ChangeFilter{Since: oldTick})
	require.NoError(t, err)
	require.Empty(t, events, "the standby has replayed no change after the cursor")
	require.Equal(t, oldTick, next)
	head, err := st.FeedHead(ctx)
	require.NoError(t, err)
	_, next, err = st.Changes(ctx, store.ChangeFilter{Since: head})
	require.NoError(t, err, "a cursor the standby lacks is read on the primary")
	require.GreaterOrEqual(t, next, head)

	pgtest.ResumeReplay(t, e.primaryDSN, e.readDSN)
	page, err = st.List(ctx, api.Filter{})
	require.NoError(t, err)
	require.Equal(t, []api.TaskID{"task-a", "task-b"}, taskIDs(page))
	a, err = st.Get(ctx, "task-a")
	require.NoError(t, err)
	require.Equal(t, api.StatusRunning, a.Status)
	events, _, err = st.Changes(ctx, store.ChangeFilter{Since: oldTick})
	require.NoError(t, err)
	require.Equal(t, []api.Status{api.StatusScheduled, api.StatusRunning}, eventsOf(events, "task-b"))
}

// Reads go to the primary while the standby is down.
func TestStandbyDownReadsFallBackToPrimary(t *testing.T) {
	t.Parallel()
	e := openStandbyT(t)
	ctx, st := e.ctx, e.st
	_, err := st.List(ctx, api.Filter{}) // a pooled connection to the standby
	require.NoError(t, err)
	require.NoError(t, e.standby.Stop())

	submitT(t, ctx, st, store.NewTask{ID: "task-a"})
	head, err := st.FeedHead(ctx)
	require.NoError(t, err)
	claimT(t, ctx, st, 10, 0)
	page, err := st.List(ctx, api.Filter{})
	require.NoError(t, err)
	require.Equal(t, []api.TaskID{"task-a"}, taskIDs(page))
	a, err := st.Get(ctx, "task-a")
	require.NoError(t, err)
	require.Equal(t, api.StatusRunning, a.Status)
	stats, err := st.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), statusCount(stats, api.StatusRunning))
	events, _, err := st.Changes(ctx, store.ChangeFilter{Since: head})
	require.NoError(t, err)
	require.Equal(t, []api.Status{api.StatusRunning}, eventsOf(events, "task-a"))
	_, err = st.RecentChanges(ctx, 10)
	require.NoError(t, err)
	_, err = st.FeedConsumers(ctx)
	require.NoError(t, err)
}

// A read URL that is malformed or that nothing answers fails Open.
func TestOpenRefusesABadReadURL(t *testing.T) {
	t.Parallel()
	primary := pgtest.New(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedPort := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	for _, tc := range []struct {
		name, dsn, want string
	}{
		{"malformed", "postgres://user@host:notaport/db", "open store: parse read database URL"},
		{"unreachable", "postgres://postgres@127.0.0.1:" + strconv.Itoa(closedPort) + "/x?sslmode=disable&connect_timeout=5", "open store: read database: connect"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			st, err := postgres.Open(ctx, primary, postgres.ReadDSN(tc.dsn))
			require.Nil(t, st)
			require.ErrorContains(t, err, tc.want)
		})
	}
	// An empty read URL keeps every read on the primary.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := postgres.Open(ctx, primary, postgres.ReadDSN(" "))
	require.NoError(t, err)
	defer st.Close()
	require.False(t, st.HasStandby())
}
