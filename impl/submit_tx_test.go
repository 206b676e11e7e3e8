package impl_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// slowPolls makes a node that finds due tasks only through notifications
// within any test's time: its polls come every 10 minutes.
func slowPolls(cfg *impl.ServerConfig) {
	cfg.PollInterval, cfg.AwaitPollInterval = 10*time.Minute, 10*time.Minute
}

// TestSubmitTxRunsOnceCommitted submits in a transaction that also writes
// a row of the caller's: nobody sees the task before the commit, and the
// commit's notification wakes the node, whose polls are too slow to find
// it within the test's deadline.
func TestSubmitTxRunsOnceCommitted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", 5*time.Second, slowPolls)
	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(e.ctx) }()
	_, err = tx.Exec(e.ctx, `INSERT INTO test_effect (task_id, step) VALUES ('order-1', 1)`)
	require.NoError(t, err)
	f, err := impl.SubmitTx(e.ctx, srv.Client, tx, workKind, WorkParams{Key: "order-1"})
	require.NoError(t, err)
	require.True(t, f.Submission().Created)
	again, err := srv.SubmitTx(e.ctx, tx, workReq(workKind, WorkParams{Key: "order-1"}))
	require.NoError(t, err)
	require.False(t, again.Created, "a second submit of the id in the transaction merges, as Submit does")

	_, err = srv.Get(e.ctx, f.ID())
	require.ErrorIs(t, err, api.ErrNotFound, "the task is invisible before the commit")
	require.NoError(t, tx.Commit(e.ctx))

	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	res, err := f.Await(ctx)
	require.NoError(t, err, "the commit's notification woke the node")
	require.Equal(t, "order-1", res.Key)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_run WHERE task_id = $1`, string(f.ID())))
}

// TestSubmitTxRolledBackLeavesNothing rolls back a transaction with
// submits in it: no task, no run, and no notification to the claimers.
func TestSubmitTxRolledBackLeavesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	listener := e.listenDue()

	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	_, err = c.SubmitTx(e.ctx, tx, workReq(workKind, WorkParams{Key: "one"}))
	require.NoError(t, err)
	_, err = c.SubmitManyTx(e.ctx, tx, []api.SubmitRequest{workReq(workKind, WorkParams{Key: "two"}), workReq(shareKind, WorkParams{Key: "three"})})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(e.ctx))
	e.requireRolledBack(c, listener)
}

// listenDue returns a connection listening to the claimers' channel.
func (e *env) listenDue() *pgx.Conn {
	e.t.Helper()
	listener, err := pgx.Connect(e.ctx, e.dsn)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { listener.Close(context.Background()) })
	_, err = listener.Exec(e.ctx, `LISTEN `+store.ChannelDue)
	require.NoError(e.t, err)
	return listener
}

// requireRolledBack checks that the submits of a rolled-back transaction
// left no task and sent listener, listening since before them, nothing.
func (e *env) requireRolledBack(c *impl.Client, listener *pgx.Conn) {
	e.t.Helper()
	page, err := c.List(e.ctx, api.Filter{})
	require.NoError(e.t, err)
	require.Empty(e.t, page.Tasks)
	// Notifications arrive in commit order: anything the rolled-back
	// submits sent would come before this marker.
	_, err = e.pool.Exec(e.ctx, `SELECT pg_notify($1, 'marker')`, store.ChannelDue)
	require.NoError(e.t, err)
	n, err := listener.WaitForNotification(e.ctx)
	require.NoError(e.t, err)
	require.Equal(e.t, "marker", n.Payload, "the rolled-back submits notified nobody")
}

// badSubmits are requests a submit refuses before writing anything: an
// unknown behavior, malformed params, an id the behavior does not derive,
// a negative delay.
var badSubmits = []api.SubmitRequest{
	{Behavior: "no.such.behavior", Params: json.RawMessage(`{}`)},
	{Behavior: workKind.ID, Params: json.RawMessage(`{"key":`)},
	{Behavior: workKind.ID, Params: json.RawMessage(`{"key":"x"}`), ID: "x"},
	{Behavior: workKind.ID, Params: json.RawMessage(`{"key":"neg"}`), Delay: -time.Second},
}

// badSubmitMany is a SubmitMany refused as a whole for one bad request.
var badSubmitMany = []api.SubmitRequest{workReq(workKind, WorkParams{Key: "good"}), {Behavior: workKind.ID, Params: json.RawMessage(`[]`)}}

// TestSubmitTxRefusesWhatSubmitRefuses checks bad input: each is refused
// before anything is written, and the caller's transaction stays usable.
func TestSubmitTxRefusesWhatSubmitRefuses(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	_, err := c.SubmitTx(e.ctx, nil, workReq(workKind, WorkParams{Key: "nil-tx"}))
	require.ErrorIs(t, err, api.ErrInvalid)
	_, err = c.SubmitManyTx(e.ctx, nil, []api.SubmitRequest{workReq(workKind, WorkParams{Key: "nil-tx"})})
	require.ErrorIs(t, err, api.ErrInvalid)

	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(e.ctx) }()
	for _, req := range badSubmits {
		_, err := c.SubmitTx(e.ctx, tx, req)
		require.ErrorIs(t, err, api.ErrInvalid, "%+v", req)
	}
	_, err = c.SubmitManyTx(e.ctx, tx, badSubmitMany)
	require.ErrorIs(t, err, api.ErrInvalid)
	sub, err := c.SubmitTx(e.ctx, tx, workReq(workKind, WorkParams{Key: "after"}))
	require.NoError(t, err, "the transaction is still usable")
	require.NoError(t, tx.Commit(e.ctx))
	page, err := c.List(e.ctx, api.Filter{})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 1)
	require.Equal(t, sub.ID, page.Tasks[0].ID)
}

// TestSubmitTxThroughPgBouncer submits in a transaction on a connection
// through PgBouncer in transaction mode, and the task runs.
func TestSubmitTxThroughPgBouncer(t *testing.T) {
	t.Parallel()
	e := setup(t)
	bouncer := pgtest.StartPgBouncer(t, e.dsn).URL
	st, err := postgres.Open(e.ctx, bouncer, postgres.ListenDSN(e.dsn))
	require.NoError(t, err)
	t.Cleanup(st.Close)
	e.server("node", 5*time.Second, slowPolls)
	client, err := impl.NewClient(st, impl.ClientConfig{Registry: testRegistry(e.pool, "c", time.Second)})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	var f *api.Future[WorkResult]
	require.NoError(t, pgx.BeginFunc(e.ctx, st.Pool(), func(tx pgx.Tx) error {
		f, err = impl.SubmitTx(e.ctx, client, tx, workKind, WorkParams{Key: "bounced"})
		return err
	}))
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	res, err := f.Await(ctx)
	require.NoError(t, err)
	require.Equal(t, "bounced", res.Key)
}
