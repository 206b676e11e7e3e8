package signals

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/internal/chaos"
	"github.com/stinthq/stint/spi"
)

func TestMain(m *testing.M) {
	chaos.Main(m, func(reg *spi.Registry, pool *pgxpool.Pool, node string) {
		spi.MustRegister[receiverParams, int](reg, receiver{pool: pool, node: node})
	})
}
