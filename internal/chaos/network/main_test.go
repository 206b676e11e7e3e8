package network

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/internal/chaos"
	"github.com/stinthq/stint/spi"
)

func TestMain(m *testing.M) {
	chaos.Main(m, func(reg *spi.Registry, pool *pgxpool.Pool, _ string) {
		spi.MustRegister[chaos.WorkParams, string](reg, locked{pool: pool})
	})
}
