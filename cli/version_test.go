package cli

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/buildinfo"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// runSelf runs this test binary as a program calling Main (see TestMain)
// with args and no database in its environment, and returns what it
// printed and its exit code.
func runSelf(t *testing.T, args ...string) result {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	stdout, stderr, code := RunProgram(t, self, args...)
	return result{stdout: stdout, stderr: stderr, code: code}
}

// highestMigration returns the highest version among the migration files
// in dir.
func highestMigration(t *testing.T, dir string) int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	highest := 0
	for _, e := range entries {
		if m := regexp.MustCompile(`^(\d{4})_.*\.up\.sql$`).FindStringSubmatch(e.Name()); m != nil {
			v, err := strconv.Atoi(m[1])
			require.NoError(t, err)
			highest = max(highest, v)
		}
	}
	require.NotZero(t, highest, "no migrations in %s", dir)
	return highest
}

// TestVersionSaysVersionCommitAndSchema: `stint version` and `stint
// --version`, run as a process, print stint's module version, its commit
// and the schema level the binary needs, per migration line.
func TestVersionSaysVersionCommitAndSchema(t *testing.T) {
	t.Parallel()
	info := buildinfo.Read()
	want := fmt.Sprintf(`(?m)\Astint %s\ncommit: %s\nschema: stint %04d, ingest %04d, replication %04d\ngo: go\S+\n\z`,
		regexp.QuoteMeta(info.Version), regexp.QuoteMeta(orDash(info.Commit)),
		highestMigration(t, "../migrations"), highestMigration(t, "../migrations/ingest"), highestMigration(t, "../migrations/replication"))
	for _, args := range [][]string{{"version"}, {"--version"}} {
		r := runSelf(t, args...)
		require.Equal(t, exitOK, r.code, "%v: %s", args, r.stderr)
		require.Regexp(t, want, r.stdout, "%v", args)
		require.Empty(t, r.stderr, "%v", args)
		// A test binary carries no VCS stamp: it names the release of
		// CHANGELOG.md its source holds.
		require.True(t, strings.HasPrefix(r.stdout, "stint "+buildinfo.Release+"+devel\n"), "%v: %s", args, r.stdout)
	}
	r := runSelf(t, "version", "extra")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "takes no arguments")
}

// TestNodesLsShowsVersions: each node's version, as it registered, is in
// `stint nodes ls` and its JSON; a node of a version that did not record
// it shows "-".
func TestNodesLsShowsVersions(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	startServer(t, ctx, dsn, "node-versioned")
	st, err := postgres.Open(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	require.NoError(t, st.RegisterNode(ctx, store.Node{ID: "node-unversioned", Host: "h", PID: 1}))
	r := runCLI(ctx, "nodes", "ls", "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `(?m)^ID\s+VERSION\s+HOST`, r.stdout)
	require.Regexp(t, `(?m)^node-versioned\s+`+regexp.QuoteMeta(buildinfo.Read().String())+`\s`, r.stdout)
	require.Regexp(t, `(?m)^node-versioned\s+`+regexp.QuoteMeta(buildinfo.Release)+`\+devel\s`, r.stdout, "a node names its release")
	require.Regexp(t, `(?m)^node-unversioned\s+-\s+h\s`, r.stdout)

	r = runCLI(ctx, "nodes", "ls", "--json", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, `"version": "`+buildinfo.Read().String()+`"`)
}
