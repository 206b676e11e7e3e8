package impl_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// setupStandby is setup on a database with a hot standby of its own: e.st
// reads from the standby. It returns the standby's DSN.
func setupStandby(t *testing.T) (*env, string) {
	t.Helper()
	primary, readDSN, _ := pgtest.NewStandby(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	st, err := postgres.Open(ctx, primary, postgres.ReadDSN(readDSN))
	require.NoError(t, err)
	t.Cleanup(st.Close)
	_, err = st.Pool().Exec(ctx, `CREATE TABLE test_run (task_id text, attempt int, node text, at timestamptz DEFAULT clock_timestamp())`)
	require.NoError(t, err)
	pgtest.CatchUp(t, primary, readDSN)
	return &env{t: t, ctx: ctx, dsn: primary, st: st, pool: st.Pool()}, readDSN
}

// awaitInBackground starts Await of id on c and waits until its first read
// is done (the task is flagged awaited on the primary), so that the task
// can only finish after it.
func (e *env) awaitInBackground(c *impl.Client, id api.TaskID) <-chan error {
	e.t.Helper()
	done := make(chan error, 1)
	go func() {
		task, err := c.Await(e.ctx, id)
		if err == nil && task.Status != api.StatusSuccess {
			err = &api.TaskError{Message: "finished with " + string(task.Status)}
		}
		done <- err
	}()
	waitFor(e.t, time.Minute, "Await's first read", func() bool {
		return e.count(`SELECT count(*) FROM stint_task WHERE id = $1 AND awaited`, string(id)) == 1
	})
	return done
}

// submitAndPause submits a test.work task through c, waits until the
// standby at readDSN shows it, and pauses the standby's replay: from then
// on the standby shows the task as scheduled, whatever becomes of it.
func (e *env) submitAndPause(c *impl.Client, readDSN string) api.TaskID {
	e.t.Helper()
	sub, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "lag"}))
	require.NoError(e.t, err)
	pgtest.CatchUp(e.t, e.dsn, readDSN)
	pgtest.PauseReplay(e.t, readDSN)
	return sub.ID
}

// requireStaleOnStandby checks that c reads task id from the paused
// standby, which still shows it scheduled.
func (e *env) requireStaleOnStandby(c *impl.Client, id api.TaskID) {
	e.t.Helper()
	task, err := c.Get(e.ctx, id)
	require.NoError(e.t, err)
	require.Equal(e.t, api.StatusScheduled, task.Status, "Get reads the paused standby")
}

// With the standby's replay paused, a task run on the primary is awaited
// to its end: Await's first read and its read after the finish
// notification go to the primary, while its client's Get reads the
// standby, which still shows the task scheduled.
func TestAwaitWithAPausedStandbyReturnsOnTheFinishNotification(t *testing.T) {
	t.Parallel()
	e, readDSN := setupStandby(t)
	// Polls would come only after an hour: the finish notification must
	// end the wait.
	c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: testRegistry(e.pool, "client", time.Minute), PollInterval: time.Hour})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	e.requireAwaitSeesTheEnd(c, readDSN)
}

// Without notifications (PollOnly), Await still sees the end of a task
// that a paused standby does not show, by the polls it sends to the
// primary (every tenth).
func TestAwaitWithAPausedStandbyAndNoNotificationsPollsThePrimary(t *testing.T) {
	t.Parallel()
	e, readDSN := setupStandby(t)
	pollOnly, err := postgres.Open(e.ctx, e.dsn, postgres.ReadDSN(readDSN), postgres.PollOnly())
	require.NoError(t, err)
	t.Cleanup(pollOnly.Close)
	c, err := impl.NewClient(pollOnly, impl.ClientConfig{Registry: testRegistry(e.pool, "client", time.Minute), PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	e.requireAwaitSeesTheEnd(c, readDSN)
}

// requireAwaitSeesTheEnd submits a task with the standby's replay paused,
// awaits it through c while a server runs it, and requires Await to return
// although the standby still shows the task unfinished.
func (e *env) requireAwaitSeesTheEnd(c *impl.Client, readDSN string) {
	e.t.Helper()
	id := e.submitAndPause(c, readDSN)
	done := e.awaitInBackground(c, id)

	e.server("n1", time.Minute)
	select {
	case err := <-done:
		require.NoError(e.t, err)
	case <-e.ctx.Done():
		e.t.Fatal("Await did not return after the task finished")
	}
	e.requireStaleOnStandby(c, id)
}

// listSelf counts, inside its run, the tasks of its behavior that List
// shows, through the server's own Tasks.
type listSelf struct{ tasks *api.Tasks }

var listSelfKind = api.Kind[struct{}, int]{ID: "test.list_self"}

func (b *listSelf) Kind() api.Kind[struct{}, int] { return listSelfKind }

func (b *listSelf) TaskID(ids spi.IDs, _ struct{}) api.TaskID { return ids.Unique() }

func (b *listSelf) Run(ctx context.Context, _ spi.RunContext, _ struct{}) (int, error) {
	page, err := (*b.tasks).List(ctx, api.Filter{Behavior: listSelfKind.ID})
	return len(page.Tasks), err
}

// A run's reads go to the primary: a run sees its own task although the
// paused standby has never seen it.
func TestRunReadsThePrimary(t *testing.T) {
	t.Parallel()
	e, readDSN := setupStandby(t)
	pgtest.PauseReplay(t, readDSN)
	var tasks api.Tasks
	reg := spi.NewRegistry()
	spi.MustRegister[struct{}, int](reg, &listSelf{tasks: &tasks})
	srv, err := impl.NewServer(e.st, impl.ServerConfig{Node: "n1", Registry: reg,
		PollInterval: 100 * time.Millisecond, AwaitPollInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	require.NoError(t, err)
	tasks = srv
	require.NoError(t, srv.Start(e.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	f, err := api.Submit(e.ctx, srv, listSelfKind, struct{}{})
	require.NoError(t, err)
	seen, err := f.Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, seen, "the run lists its own task")
	page, err := srv.List(e.ctx, api.Filter{Behavior: listSelfKind.ID})
	require.NoError(t, err)
	require.Empty(t, page.Tasks, "outside a run, List reads the paused standby")
}
