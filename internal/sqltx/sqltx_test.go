package sqltx_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/sqltx"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestRunInTheCallersTransaction runs pgx statements in a database/sql
// transaction: they see its writes and it sees theirs, a nested
// transaction is a savepoint (a rolled-back one leaves the rest), fn's
// error comes back as it is, the transaction itself can be neither
// committed nor rolled back through the pgx.Tx, and everything goes with
// the caller's rollback.
func TestRunInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := sql.Open("pgx", pgtest.New(t))
	require.NoError(t, err)
	defer db.Close()
	_, err = db.ExecContext(ctx, `CREATE TABLE item (name text)`)
	require.NoError(t, err)
	count := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) int {
		var n int
		require.NoError(t, q.QueryRowContext(ctx, `SELECT count(*) FROM item`).Scan(&n))
		return n
	}

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO item VALUES ('by database/sql')`)
	require.NoError(t, err)
	boom := errors.New("boom")
	err = sqltx.Run(ctx, tx, func(ptx pgx.Tx) error {
		var n int
		require.NoError(t, ptx.QueryRow(ctx, `SELECT count(*) FROM item`).Scan(&n))
		require.Equal(t, 1, n, "pgx sees the transaction's write")
		_, err := ptx.Exec(ctx, `INSERT INTO item VALUES ($1)`, "by pgx")
		require.NoError(t, err)
		require.ErrorIs(t, pgx.BeginFunc(ctx, ptx, func(sp pgx.Tx) error {
			_, err := sp.Exec(ctx, `INSERT INTO item VALUES ('rolled back')`)
			require.NoError(t, err)
			return boom
		}), boom)
		require.NoError(t, pgx.BeginFunc(ctx, ptx, func(sp pgx.Tx) error {
			_, err := sp.Exec(ctx, `INSERT INTO item VALUES ('released')`)
			return err
		}))
		require.Error(t, ptx.Commit(ctx), "the caller's transaction is not pgx's to commit")
		require.Error(t, ptx.Rollback(ctx), "nor to roll back")
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Equal(t, 3, count(tx), "database/sql sees pgx's writes but the rolled-back savepoint's")

	_, err = tx.ExecContext(ctx, `SELECT 1`)
	require.NoError(t, err, "fn's error left the transaction usable")
	require.NoError(t, tx.Rollback())
	require.Equal(t, 0, count(db), "all of it went with the rollback")

	require.ErrorIs(t, sqltx.Run(ctx, tx, func(pgx.Tx) error { return nil }), sql.ErrTxDone)
	require.Error(t, sqltx.Run(ctx, nil, func(pgx.Tx) error { return nil }))
}
