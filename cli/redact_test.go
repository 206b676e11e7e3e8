package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/syncbuf"
)

// TestPasswordsAreNeverShown submits a replication whose DSNs hold
// passwords (URL and key=value) and reads it back through every surface:
// tasks show, tasks ls, submit --wait --json and the HTTP API. None shows a
// password; the stored params keep them for the runs.
func TestPasswordsAreNeverShown(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	const secret1, secret2 = "s3cr3t-source", "s3cr3t-target"
	params := `{"source":{"dsn":"postgres://app:` + secret1 + `@db1.example/orders","table":"orders"},` +
		`"target":{"dsn":"host=db2.example user=app password=` + secret2 + ` dbname=copy","table":"orders"},` +
		`"change_column":"seq"}`
	r := runCLI(ctx, "submit", "replication", "--params", params, "--id", "repl-secret", "--delay", "1h", "--json", "--db", dsn)
	requireOK(t, r)

	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	var stored string
	require.NoError(t, conn.QueryRow(ctx, `SELECT params::text FROM stint_task WHERE id = 'repl-secret'`).Scan(&stored))
	require.Contains(t, stored, secret1, "the runs need the password")
	require.Contains(t, stored, secret2, "the runs need the password")

	shown := []string{r.stdout + r.stderr}
	for _, args := range [][]string{
		{"tasks", "show", "repl-secret"},
		{"tasks", "show", "repl-secret", "--json"},
		{"tasks", "ls", "--json"},
		{"tasks", "wait", "repl-secret", "--timeout", "1ms", "--json"},
	} {
		r := runCLI(ctx, append(args, "--db", dsn)...)
		shown = append(shown, r.stdout+r.stderr)
	}
	require.Contains(t, shown[1], "postgres://app:xxxxx@db1.example/orders")
	require.Contains(t, shown[1], "password=xxxxx")

	// The HTTP API of a server node.
	srvCtx, stop := context.WithCancel(ctx)
	defer stop()
	var stdout, stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		args := []string{"server", "--db", dsn, "--behaviors", "demo.echo", "--http", "127.0.0.1:0", "--insecure-no-auth"}
		done <- Run(srvCtx, args, nil, strings.NewReader(""), &stdout, &stderr)
	}()
	dashboard := regexp.MustCompile(`dashboard: (http://\S+)/`)
	waitFor(t, time.Minute, "the HTTP server", func() bool { return dashboard.MatchString(stdout.String()) })
	base := dashboard.FindStringSubmatch(stdout.String())[1]
	for _, path := range []string{"/api/v1/tasks/repl-secret", "/api/v1/tasks?behavior=replication&fields=payloads"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		require.Contains(t, string(body), "xxxxx", path)
		shown = append(shown, string(body))
	}
	stop()
	require.Equal(t, exitOK, <-done, stderr.String())
	shown = append(shown, stdout.String()+stderr.String())

	for i, out := range shown {
		require.NotContains(t, out, secret1, "output %d:\n%s", i, out)
		require.NotContains(t, out, secret2, "output %d:\n%s", i, out)
	}
	require.Len(t, shown, 8, fmt.Sprint(shown))
}
