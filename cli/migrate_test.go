package cli

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/migrations"
)

func TestMigrateStatusDownUp(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	all, err := migrations.All()
	require.NoError(t, err)
	require.NotEmpty(t, all)
	newest := all[len(all)-1]
	applied := regexp.MustCompile(`^\S+\s+\d+\s+\S+\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`)

	// pgtest's database is fully migrated.
	r := runCLI(ctx, "migrate", "status", "--db", dsn)
	requireOK(t, r)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, len(all)+1, r.stdout)
	require.Regexp(t, `^LINE\s+VERSION\s+NAME\s+APPLIED AT$`, lines[0])
	require.Regexp(t, `^stint\s+1\s+tasks\s+\d{4}-`, lines[1])
	require.Regexp(t, `^ingest\s+1\s+inventory\s+\d{4}-`, r.stdout[strings.Index(r.stdout, "\ningest")+1:])
	for _, line := range lines[1:] {
		require.Regexp(t, applied, line)
	}

	r = runCLI(ctx, "migrate", "up", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "the schema is up to date")

	name := newest.String()
	r = runCLI(ctx, "migrate", "down", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "reverted "+name+"\n", r.stdout)

	r = runCLI(ctx, "migrate", "status", "--db", dsn)
	requireOK(t, r)
	lines = strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Regexp(t, fmt.Sprintf(`^%s\s+%d\s+%s\s+pending$`, newest.Line, newest.Version, regexp.QuoteMeta(newest.Name)), lines[len(lines)-1])

	r = runCLI(ctx, "migrate", "up", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "applied "+name+"\n", r.stdout)

	r = runCLI(ctx, "migrate", "status", "--db", dsn)
	requireOK(t, r)
	require.NotContains(t, r.stdout, "pending")
}
