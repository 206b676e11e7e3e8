package cli

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTelemetryIsOffUnlessTheEnvironmentAsks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		endpoint, disabled string
		on                 bool
	}{
		{"", "", false},
		{"http://127.0.0.1:4317", "true", false},
		{"http://127.0.0.1:4317", "", true},
	} {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", tc.endpoint)
		t.Setenv("OTEL_SDK_DISABLED", tc.disabled)
		var stderr bytes.Buffer
		shutdown, err := setupTelemetry(ctx, "stint", &stderr)
		require.NoError(t, err)
		require.Equal(t, tc.on, stderr.Len() > 0, "endpoint %q disabled %q: %s", tc.endpoint, tc.disabled, stderr.String())
		sctx, scancel := context.WithTimeout(ctx, time.Second)
		_ = shutdown(sctx) // nothing listens on the endpoint: the flush may fail
		scancel()
	}
}
