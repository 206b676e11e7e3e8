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
	applied := regexp.MustCompile(`^\d+\s+\S+\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`)

	// pgtest's database is fully migrated.
	r := runCLI(ctx, "migrate", "status", "--db", dsn)
	requireOK(t, r)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, len(all)+1, r.stdout)
	require.Regexp(t, `^VERSION\s+NAME\s+APPLIED AT$`, lines[0])
	require.Regexp(t, `^1\s+tasks\s+\d{4}-`, lines[1])
	for _, line := range lines[1:] {
		require.Regexp(t, applied, line)
	}

	r = runCLI(ctx, "migrate", "up", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "the schema is up to date")

	name := fmt.Sprintf("%04d_%s", newest.Version, newest.Name)
	r = runCLI(ctx, "migrate", "down", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "reverted "+name+"\n", r.stdout)

	r = runCLI(ctx, "migrate", "status", "--db", dsn)
	requireOK(t, r)
	lines = strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Regexp(t, fmt.Sprintf(`^%d\s+%s\s+pending$`, newest.Version, regexp.QuoteMeta(newest.Name)), lines[len(lines)-1])

	r = runCLI(ctx, "migrate", "up", "--db", dsn)
	requireOK(t, r)
	require.Equal(t, "applied "+name+"\n", r.stdout)

	r = runCLI(ctx, "migrate", "status", "--db", dsn)
	requireOK(t, r)
	require.NotContains(t, r.stdout, "pending")
}
