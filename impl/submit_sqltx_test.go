package impl_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// sqlDB opens the test's database through database/sql and pgx's stdlib
// driver, as GORM, Bun and sqlx reach PostgreSQL.
func (e *env) sqlDB() *sql.DB {
	e.t.Helper()
	db, err := sql.Open("pgx", e.dsn)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = db.Close() })
	return db
}

// TestSubmitSQLTxRunsOnceCommitted submits in a database/sql transaction
// that also writes a row of the caller's: nobody sees the task before the
// commit, and the commit's notification wakes the node, whose polls are
// too slow to find it within the test's deadline.
func TestSubmitSQLTxRunsOnceCommitted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	db := e.sqlDB()
	srv := e.server("node", 5*time.Second, slowPolls)
	tx, err := db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = tx.ExecContext(e.ctx, `INSERT INTO test_effect (task_id, step) VALUES ('order-1', 1)`)
	require.NoError(t, err)
	f, err := impl.SubmitSQLTx(e.ctx, srv.Client, tx, workKind, WorkParams{Key: "order-1"})
	require.NoError(t, err)
	require.True(t, f.Submission().Created)
	again, err := srv.SubmitSQLTx(e.ctx, tx, workReq(workKind, WorkParams{Key: "order-1"}))
	require.NoError(t, err)
	require.False(t, again.Created, "a second submit of the id in the transaction merges, as Submit does")
	var n int
	require.NoError(t, tx.QueryRowContext(e.ctx, `SELECT count(*) FROM stint_task WHERE id = $1`, string(f.ID())).Scan(&n))
	require.Equal(t, 1, n, "the transaction sees its task")

	_, err = srv.Get(e.ctx, f.ID())
	require.ErrorIs(t, err, api.ErrNotFound, "the task is invisible before the commit")
	require.NoError(t, tx.Commit())

	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	res, err := f.Await(ctx)
	require.NoError(t, err, "the commit's notification woke the node")
	require.Equal(t, "order-1", res.Key)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_run WHERE task_id = $1`, string(f.ID())))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_effect WHERE task_id = 'order-1'`))
}

// TestSubmitManySQLTxMixedAndCombined submits, in one database/sql
// transaction, tasks of both dedup modes (two statements under a
// savepoint) and tasks whose behavior combines params (a savepoint each):
// all of them commit with the transaction, and all of them go with its
// rollback, notifying nobody.
func TestSubmitManySQLTxMixedAndCombined(t *testing.T) {
	t.Parallel()
	e := setup(t)
	db := e.sqlDB()
	reg := testRegistry(e.pool, "c", time.Second)
	spi.MustRegister[MergeParams, []string](reg, merge{})
	c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	merged := func(key string, items ...string) api.SubmitRequest {
		p, err := json.Marshal(MergeParams{Key: key, Items: items})
		require.NoError(t, err)
		return api.SubmitRequest{Behavior: mergeKind.ID, Params: p, Delay: time.Hour}
	}
	submitAll := func(tx *sql.Tx) []api.Submission {
		subs, err := c.SubmitManySQLTx(e.ctx, tx, []api.SubmitRequest{
			workReq(workKind, WorkParams{Key: "one"}), workReq(shareKind, WorkParams{Key: "two"}), merged("m", "a", "b"),
		})
		require.NoError(t, err)
		_, err = c.SubmitSQLTx(e.ctx, tx, merged("m", "b", "c"))
		require.NoError(t, err)
		return subs
	}

	listener := e.listenDue()
	tx, err := db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	submitAll(tx)
	require.NoError(t, tx.Rollback())
	e.requireRolledBack(c, listener)

	tx, err = db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	subs := submitAll(tx)
	require.NoError(t, tx.Commit())
	wait, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	note, err := listener.WaitForNotification(wait)
	require.NoError(t, err, "the commit notified the claimers")
	require.Empty(t, note.Payload)
	for _, sub := range subs {
		_, err := c.Get(e.ctx, sub.ID)
		require.NoError(t, err, "%s exists once committed", sub.ID)
	}
	task, err := c.Get(e.ctx, subs[2].ID)
	require.NoError(t, err)
	var p MergeParams
	require.NoError(t, json.Unmarshal(task.Params, &p))
	require.Equal(t, []string{"a", "b", "c"}, p.Items, "the second submit combined its params in the transaction")
}

// TestSubmitSQLTxRefusesBadInput checks bad input: a nil, ended or
// foreign transaction and bad requests are refused with ErrInvalid or the
// transaction's own error, and each leaves the transaction usable.
func TestSubmitSQLTxRefusesBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	db := e.sqlDB()
	c := e.client()
	_, err := c.SubmitSQLTx(e.ctx, nil, workReq(workKind, WorkParams{Key: "nil-tx"}))
	require.ErrorIs(t, err, api.ErrInvalid)
	_, err = c.SubmitManySQLTx(e.ctx, nil, []api.SubmitRequest{workReq(workKind, WorkParams{Key: "nil-tx"})})
	require.ErrorIs(t, err, api.ErrInvalid)

	ended, err := db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	require.NoError(t, ended.Rollback())
	_, err = c.SubmitSQLTx(e.ctx, ended, workReq(workKind, WorkParams{Key: "ended"}))
	require.ErrorIs(t, err, sql.ErrTxDone)

	// A driver that wraps pgx's, as tracing wrappers do, but checks
	// arguments as database/sql's default converter does.
	foreign := sql.OpenDB(wrappedConnector{stdlib.GetDefaultDriver().(*stdlib.Driver), e.dsn})
	t.Cleanup(func() { _ = foreign.Close() })
	ftx, err := foreign.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	_, err = c.SubmitSQLTx(e.ctx, ftx, workReq(workKind, WorkParams{Key: "foreign"}))
	require.ErrorIs(t, err, api.ErrInvalid)
	require.ErrorContains(t, err, "pgx's stdlib driver")
	_, err = ftx.ExecContext(e.ctx, `INSERT INTO test_effect (task_id, step) VALUES ('foreign', 1)`)
	require.NoError(t, err, "the foreign transaction is still usable")
	require.NoError(t, ftx.Commit())

	tx, err := db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	for _, req := range badSubmits {
		_, err := c.SubmitSQLTx(e.ctx, tx, req)
		require.ErrorIs(t, err, api.ErrInvalid, "%+v", req)
	}
	_, err = c.SubmitManySQLTx(e.ctx, tx, badSubmitMany)
	require.ErrorIs(t, err, api.ErrInvalid)
	sub, err := c.SubmitSQLTx(e.ctx, tx, workReq(workKind, WorkParams{Key: "after"}))
	require.NoError(t, err, "the transaction is still usable")
	require.NoError(t, tx.Commit())
	page, err := c.List(e.ctx, api.Filter{})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 1)
	require.Equal(t, sub.ID, page.Tasks[0].ID)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_effect WHERE task_id = 'foreign'`))
}

// wrappedConnector opens pgx's stdlib connections behind a connection
// type of its own that passes statements through but not pgx's argument
// checking, as a driver other than pgx's checks arguments.
type wrappedConnector struct {
	d   *stdlib.Driver
	dsn string
}

func (w wrappedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := w.d.Open(w.dsn)
	if err != nil {
		return nil, err
	}
	return wrappedConn{c.(*stdlib.Conn)}, nil
}

func (w wrappedConnector) Driver() driver.Driver { return w.d }

// wrappedConn is a pgx stdlib connection without CheckNamedValue.
type wrappedConn struct{ c *stdlib.Conn }

func (w wrappedConn) Prepare(q string) (driver.Stmt, error) { return w.c.Prepare(q) }
func (w wrappedConn) Close() error                          { return w.c.Close() }
func (w wrappedConn) Begin() (driver.Tx, error) {
	return w.c.BeginTx(context.Background(), driver.TxOptions{})
}
func (w wrappedConn) BeginTx(ctx context.Context, o driver.TxOptions) (driver.Tx, error) {
	return w.c.BeginTx(ctx, o)
}
func (w wrappedConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	return w.c.ExecContext(ctx, q, args)
}
