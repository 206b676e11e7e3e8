package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
)

// TestReplicationsDefineUndefineTrigger installs a change trigger on a
// real source database, defines a persistent replication into a real
// target, shows and undefines it; each bad input is refused with a clear
// error and changes nothing.
func TestReplicationsDefineUndefineTrigger(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 3*time.Minute)
	dsn, srcDSN, dstDSN := pgtest.New(t), pgtest.New(t), pgtest.New(t)
	exec := func(dsn, sql string) {
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		defer conn.Close(context.WithoutCancel(ctx))
		_, err = conn.Exec(ctx, sql)
		require.NoError(t, err)
	}
	exec(srcDSN, `CREATE TABLE orders (id bigint PRIMARY KEY, qty int); INSERT INTO orders SELECT g, g FROM generate_series(1, 5) g`)
	exec(dstDSN, `CREATE TABLE orders (id bigint PRIMARY KEY, qty int, chg bigint)`)
	definitions := func() int {
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		defer conn.Close(context.WithoutCancel(ctx))
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM stint_replication`).Scan(&n))
		return n
	}
	refused := func(code int, want string, args ...string) {
		t.Helper()
		r := runCLI(ctx, args...)
		require.Equal(t, code, r.code, "%v: %s", args, r.stderr)
		require.Contains(t, r.stderr, want, args)
		require.Empty(t, r.stdout, args)
	}

	// The change trigger.
	refused(exitUsage, "--dsn and --table are required", "replications", "trigger", "install", "--table", "orders")
	refused(exitUsage, "--dsn: ", "replications", "trigger", "install", "--dsn", "postgres://%zz", "--table", "orders")
	refused(exitFailure, "does not exist", "replications", "trigger", "install", "--dsn", srcDSN, "--table", "no_such_table")
	refused(exitFailure, "longer than 63 bytes", "replications", "trigger", "install", "--dsn", srcDSN, "--table", "orders", "--column", strings.Repeat("c", 70))
	refused(exitFailure, "bigint", "replications", "trigger", "install", "--dsn", srcDSN, "--table", "orders", "--column", "qty")
	r := runCLI(ctx, "replications", "trigger", "install", "--dsn", srcDSN, "--table", "orders", "--column", "chg")
	requireOK(t, r)
	require.Regexp(t, `^change column chg of orders installed: sequence \S+, function \S+, trigger \S+, index \S+; 5 rows backfilled\n$`, r.stdout)

	// Define: bad input writes nothing.
	params := fmt.Sprintf(`{"source":{"dsn":%q,"table":"orders"},"target":{"dsn":%q,"table":"orders"},"change_column":"chg"}`, srcDSN, dstDSN)
	file := filepath.Join(t.TempDir(), "orders.json")
	require.NoError(t, os.WriteFile(file, []byte(params), 0o600))
	define := func(args ...string) []string {
		return append(append([]string{"replications", "define"}, args...), "--db", dsn)
	}
	refused(exitUsage, "--params is required", define("orders")...)
	refused(exitUsage, "invalid params: malformed JSON", define("orders", "--params", `{"source":`)...)
	refused(exitUsage, "unknown field", define("orders", "--params", `{"sauce":{}}`)...)
	refused(exitUsage, "invalid params.source.dsn", define("orders", "--params",
		fmt.Sprintf(`{"source":{"dsn":"postgres://%%zz","table":"orders"},"target":{"dsn":%q,"table":"orders"},"change_column":"chg"}`, dstDSN))...)
	refused(exitUsage, "invalid params.source.table", define("orders", "--params",
		fmt.Sprintf(`{"source":{"dsn":%q,"table":"nope"},"target":{"dsn":%q,"table":"orders"},"change_column":"chg"}`, srcDSN, dstDSN))...)
	refused(exitUsage, "invalid name", define("", "--params", "@"+file)...)
	refused(exitUsage, "cannot read the params", define("orders", "--params", "@/no/such/file")...)
	require.Zero(t, definitions(), "the refused definitions wrote no row")
	require.Zero(t, countTasks(t, ctx, dsn), "and no task")

	r = runCLI(ctx, define("orders", "--continuous", "--params", "@"+file)...)
	requireOK(t, r)
	require.Regexp(t, `^replication orders defined: task \S+\n$`, r.stdout)
	require.Equal(t, 1, definitions())
	require.Equal(t, 1, countTasks(t, ctx, dsn))
	r = runCLI(ctx, "replications", "show", "orders", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `(?m)^mode:\s+continuous$`, r.stdout)

	// Undefine.
	refused(exitFailure, `replication definition "nope" not found`, "replications", "undefine", "nope", "--db", dsn)
	refused(exitUsage, "NAME", "replications", "undefine", "--db", dsn)
	require.Equal(t, 1, definitions(), "the refused undefines changed nothing")
	r = runCLI(ctx, "replications", "undefine", "orders", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "replication orders undefined\n", r.stdout)
	require.Zero(t, definitions())
	require.Zero(t, countTasks(t, ctx, dsn), "its task is removed")
	refused(exitFailure, `replication "orders" not found`, "replications", "show", "orders", "--db", dsn)
}
