package migrations

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// UpTo applies the core line's pending migrations up to version and no
// behavior line's: the schema a release of that level left.
func UpTo(ctx context.Context, conn *pgx.Conn, version int) error {
	return upWhere(ctx, conn, func(m Migration) bool { return m.Line == CoreLine && m.Version <= version })
}
