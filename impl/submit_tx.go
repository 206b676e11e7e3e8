package impl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/sqltx"
)

// SubmitTx submits a task of kind k with params p in the caller's
// transaction tx, as api.Submit does on its own: the task exists if and
// only if tx commits. The Future awaits it after the commit; awaiting it
// before the commit, or after a rollback, finds no task (api.ErrNotFound).
// Pass a Server's or a Client's *Client.
func SubmitTx[P, R any](ctx context.Context, c *Client, tx pgx.Tx, k api.Kind[P, R], p P, opts ...api.SubmitOption) (*api.Future[R], error) {
	return api.SubmitWith(ctx, c, func(ctx context.Context, req api.SubmitRequest) (api.Submission, error) {
		return c.SubmitTx(ctx, tx, req)
	}, k, p, opts...)
}

// SubmitSQLTx is SubmitTx in a database/sql transaction tx; see
// Client.SubmitSQLTx.
func SubmitSQLTx[P, R any](ctx context.Context, c *Client, tx *sql.Tx, k api.Kind[P, R], p P, opts ...api.SubmitOption) (*api.Future[R], error) {
	return api.SubmitWith(ctx, c, func(ctx context.Context, req api.SubmitRequest) (api.Submission, error) {
		return c.SubmitSQLTx(ctx, tx, req)
	}, k, p, opts...)
}

// SubmitSQLTx is SubmitTx in a transaction begun through database/sql,
// as GORM, Bun, sqlx and sqlc begin them: the task exists if and only if
// tx commits, and the claimers are notified at the commit. tx must come
// from pgx's stdlib driver (github.com/jackc/pgx/v5/stdlib, driver name
// "pgx", or stdlib.OpenDB); another driver's gets an api.ErrInvalid error
// and is left as it was. The statements are SubmitTx's, run on tx's
// connection, plus one empty statement. Bad input is refused before any
// statement, leaving tx usable; a statement that fails (the database's
// error) aborts tx, as any failed statement does.
func (c *Client) SubmitSQLTx(ctx context.Context, tx *sql.Tx, req api.SubmitRequest) (sub api.Submission, err error) {
	if tx == nil {
		return api.Submission{}, fmt.Errorf("submit %s: %w", req.Behavior, api.Invalid("tx", "is nil"))
	}
	ran := false
	err = sqltx.Run(ctx, tx, func(tx pgx.Tx) error {
		ran = true
		sub, err = c.submit(ctx, tx, req)
		return err
	})
	if err != nil {
		return api.Submission{}, sqlTxError(fmt.Sprintf("submit %s", req.Behavior), ran, err)
	}
	return sub, nil
}

// SubmitManySQLTx is SubmitManyTx in a database/sql transaction tx; see
// SubmitSQLTx.
func (c *Client) SubmitManySQLTx(ctx context.Context, tx *sql.Tx, reqs []api.SubmitRequest) (subs []api.Submission, err error) {
	if tx == nil {
		return nil, fmt.Errorf("submit many: %w", api.Invalid("tx", "is nil"))
	}
	ran := false
	err = sqltx.Run(ctx, tx, func(tx pgx.Tx) error {
		ran = true
		subs, err = c.submitMany(ctx, tx, reqs)
		return err
	})
	if err != nil {
		return nil, sqlTxError("submit many", ran, err)
	}
	return subs, nil
}

// sqlTxError returns err, the error of a submit in a database/sql
// transaction: the submit's own, already wrapped, when the submit ran
// (ran); otherwise the transaction's, wrapped with what, as an invalid tx
// when the transaction is not of pgx's stdlib driver.
func sqlTxError(what string, ran bool, err error) error {
	switch {
	case ran:
		return err
	case errors.Is(err, sqltx.ErrNotPgx):
		return fmt.Errorf("%s: %w", what, api.Invalid("tx", "%v", err))
	default:
		return fmt.Errorf("%s: %w", what, err)
	}
}
