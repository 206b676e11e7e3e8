package impl

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
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
