package replication

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestInstallChangeTrigger(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := e.src.Exec(e.ctx, `CREATE SCHEMA shop;
		CREATE TABLE shop."Orders" (id int PRIMARY KEY, note text);
		INSERT INTO shop."Orders" SELECT g, 'n' FROM generate_series(1, 10) g;
		CREATE TABLE wrong (id int PRIMARY KEY, chg integer)`)
	require.NoError(t, err)

	ct, err := InstallChangeTrigger(e.ctx, e.src, "shop.Orders", "chg")
	require.NoError(t, err)
	require.EqualValues(t, 10, ct.Backfilled, "existing rows get change values")
	var distinct, nulls int
	require.NoError(t, e.src.QueryRow(e.ctx, `SELECT count(DISTINCT chg), count(*) FILTER (WHERE chg IS NULL) FROM shop."Orders"`).Scan(&distinct, &nulls))
	require.Equal(t, 10, distinct)
	require.Zero(t, nulls)

	// Every write takes a new, higher value, whatever it sets.
	var before, after int64
	require.NoError(t, e.src.QueryRow(e.ctx, `SELECT max(chg) FROM shop."Orders"`).Scan(&before))
	require.NoError(t, e.src.QueryRow(e.ctx, `UPDATE shop."Orders" SET note = 'x', chg = 1 WHERE id = 3 RETURNING chg`).Scan(&after))
	require.Greater(t, after, before)
	require.NoError(t, e.src.QueryRow(e.ctx, `INSERT INTO shop."Orders" VALUES (11, 'new') RETURNING chg`).Scan(&before))
	require.Greater(t, before, after)

	again, err := InstallChangeTrigger(e.ctx, e.src, "shop.Orders", "chg")
	require.NoError(t, err, "installing twice is fine")
	require.Zero(t, again.Backfilled)
	require.Equal(t, ct.Sequence, again.Sequence)

	_, err = InstallChangeTrigger(e.ctx, e.src, "wrong", "chg")
	require.ErrorContains(t, err, "not bigint")
	_, err = InstallChangeTrigger(e.ctx, e.src, "missing", "chg")
	require.ErrorContains(t, err, "does not exist")
	_, err = InstallChangeTrigger(e.ctx, e.src, "a.b.c", "chg")
	require.Error(t, err)
}
