package freeze

import (
	"os"
	"testing"

	"github.com/stinthq/stint/internal/chaos"
)

func TestMain(m *testing.M) {
	switch {
	case os.Getenv(envMigrate) != "":
		runMigrator()
	case os.Getenv(envSetRate) != "":
		runRateSetter()
	default:
		chaos.Main(m)
	}
}
