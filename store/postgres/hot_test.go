package postgres_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestTaskIndexesKeepClaimsAndFinishesHOT checks that no index of
// stint_task covers (as a key, in an expression or in its predicate) a
// column that a claim or a finish writes: such an index would turn those
// updates from HOT updates, which write no index entry, into updates that
// write one into every index.
func TestTaskIndexesKeepClaimsAndFinishesHOT(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	rows, err := st.Pool().Query(ctx, `SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid)
		FROM pg_index WHERE indrelid = 'stint_task'::regclass`)
	require.NoError(t, err)
	defs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var d [2]string
		return d, r.Scan(&d[0], &d[1])
	})
	require.NoError(t, err)
	require.NotEmpty(t, defs)
	written := regexp.MustCompile(`\b(status|lease|node|attempt|errors|result|error|schedule_not_before|lost_not_before|` +
		`executed_at|finished_at|updated_at|waiting_children|resubmit|resubmit_due|resubmitted|progress|progress_event_at)\b`)
	for _, d := range defs {
		_, using, ok := strings.Cut(d[1], " USING ")
		require.True(t, ok, d[1])
		require.Empty(t, written.FindAllString(using, -1), "index %s: %s", d[0], d[1])
	}
}
