package impl

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stinthq/stint/api"
)

// transient reports whether err may go away on a retry: a lost connection
// (the server restarted, the backend was terminated, the network failed),
// a server that is starting, shutting down or out of resources, or a
// serialization failure. Errors of the request itself (not found, invalid,
// a missing privilege, a cancelled context) are not.
func transient(err error) bool {
	if err == nil || errors.Is(err, api.ErrNotFound) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var invalid *api.InvalidError
	if errors.As(err, &invalid) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 {
		switch pgErr.Code[:2] {
		case "08", // connection exception
			"53", // insufficient resources
			"57": // operator intervention: shutdown, terminated backend, cannot connect now
			return pgErr.Code != "57014" // query_canceled: a statement timeout or cancel is the caller's
		case "40": // serialization failure, deadlock
			return true
		}
		return false
	}
	// Not an error the server sent: the connection or the network failed.
	return true
}
