package kill

import (
	"testing"

	"github.com/stinthq/stint/internal/chaos"
)

func TestMain(m *testing.M) { chaos.Main(m) }
