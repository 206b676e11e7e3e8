package migrations

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// UpTo applies the core line's pending migrations up to version and no
// behavior line's: the schema a release of that level left.
func UpTo(ctx context.Context, conn *pgx.Conn, version int) error {
	return locked(ctx, conn, func(applied map[key]time.Time, all []Migration) error {
		for _, m := range all {
			if _, ok := applied[key{m.Line, m.Version}]; ok || m.Line != CoreLine || m.Version > version {
				continue
			}
			if err := apply(ctx, conn, m.up,
				`INSERT INTO stint_migration (line, version, name) VALUES ($1, $2, $3)`, m.Line, m.Version, m.Name); err != nil {
				return fmt.Errorf("migrate up %s: %w", m, err)
			}
		}
		return nil
	})
}
