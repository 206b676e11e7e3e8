// Package sqltx runs pgx code in a transaction begun through database/sql
// with pgx's stdlib driver (github.com/jackc/pgx/v5/stdlib), so that
// stint's statements, written for pgx, run in the caller's transaction
// unchanged: the same SQL, the same parameter encoding, the same scans.
//
// database/sql gives no way from a *sql.Tx to its driver connection. pgx
// does: a pgx.QueryRewriter passed as the first argument of a statement is
// called with the *pgx.Conn that runs it, before the statement is sent,
// and pgx's stdlib driver passes every argument through to pgx. Run sends
// one such statement through the transaction; its rewriter runs the
// caller's function on that connection, inside the transaction, and then
// leaves an empty statement to send.
package sqltx

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotPgx reports a transaction whose driver is not pgx's stdlib
// driver: Run cannot reach its connection.
var ErrNotPgx = errors.New("not a transaction of pgx's stdlib driver (github.com/jackc/pgx/v5/stdlib)")

// Run runs fn with tx seen as a pgx.Tx: its statements run on tx's
// connection, in tx. The pgx.Tx's Begin makes a savepoint, as a nested
// pgx transaction does; its own Commit and Rollback refuse, for tx is the
// caller's to end. An error of a statement leaves tx as any failed
// statement does in PostgreSQL: aborted, to be rolled back, unless it ran
// under a savepoint that was rolled back. fn must not use the pgx.Tx
// after it returns, nor tx while it runs.
func Run(ctx context.Context, tx *sql.Tx, fn func(pgx.Tx) error) error {
	if tx == nil {
		return errors.New("tx is nil")
	}
	r := &rewriter{fn: fn}
	_, err := tx.ExecContext(ctx, "", r)
	switch {
	case r.called:
		// fn's own error, unwrapped from pgx's "rewrite query failed".
		if r.err != nil {
			return r.err
		}
		return err
	case err != nil && (errors.Is(err, sql.ErrTxDone) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return err
	case err != nil:
		return fmt.Errorf("%w: %w", ErrNotPgx, err)
	default:
		return ErrNotPgx
	}
}

// rewriter runs fn on the connection pgx gives it and leaves an empty
// statement, which PostgreSQL answers with no effect.
type rewriter struct {
	fn     func(pgx.Tx) error
	called bool
	err    error
}

func (r *rewriter) RewriteQuery(ctx context.Context, conn *pgx.Conn, sql string, args []any) (string, []any, error) {
	r.called = true
	if r.err = r.fn(&connTx{conn: conn}); r.err != nil {
		return "", nil, r.err
	}
	return "", nil, nil
}

// connTx is a pgx.Tx on a connection already in a transaction that is not
// its own: at depth 0 the caller's transaction, deeper a savepoint.
type connTx struct {
	conn   *pgx.Conn
	depth  int
	closed bool
}

// Begin makes a savepoint.
func (t *connTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	next := &connTx{conn: t.conn, depth: t.depth + 1}
	if _, err := t.conn.Exec(ctx, "SAVEPOINT "+next.savepoint()); err != nil {
		return nil, err
	}
	return next, nil
}

// savepoint returns the name of t's savepoint.
func (t *connTx) savepoint() string { return "stint_sqltx_" + strconv.Itoa(t.depth) }

// errCallersTx is the error of Commit and Rollback of the caller's
// transaction itself.
var errCallersTx = errors.New("the database/sql transaction is its owner's to commit or roll back")

// Commit releases the savepoint.
func (t *connTx) Commit(ctx context.Context) error {
	return t.end(ctx, "RELEASE SAVEPOINT "+t.savepoint())
}

// Rollback rolls back to the savepoint and releases it.
func (t *connTx) Rollback(ctx context.Context) error {
	return t.end(ctx, "ROLLBACK TO SAVEPOINT "+t.savepoint()+"; RELEASE SAVEPOINT "+t.savepoint())
}

// end ends t's savepoint with the statements sql.
func (t *connTx) end(ctx context.Context, sql string) error {
	if t.depth == 0 {
		return errCallersTx
	}
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.closed = true
	_, err := t.conn.Exec(ctx, sql)
	return err
}

func (t *connTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *connTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects is not supported: pgx offers no way to make one for a
// transaction of another type. Its methods panic.
func (t *connTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (t *connTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Prepare(ctx, name, sql)
}

func (t *connTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, args...)
}

func (t *connTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

func (t *connTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *connTx) Conn() *pgx.Conn { return t.conn }
