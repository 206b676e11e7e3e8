package postgres

import (
	"sort"
	"testing"
	"time"
)

// TestStatsCost prints what the statistics reads cost on a table of a
// million tasks, all due and then all finished: Stats (the API's, exact),
// MetricStats (the metrics' and the history's), and its parts. A
// measurement, not a check: it asserts no timing.
func TestStatsCost(t *testing.T) {
	ctx, st := measureStore(t, "STINT_STATS_COST")
	submitNoop(t, ctx, st, 1000000)
	if _, err := st.pool.Exec(ctx, "ANALYZE"); err != nil {
		t.Fatal(err)
	}
	measure := func(name string, f func() error) {
		var ds []time.Duration
		for range 5 {
			start := time.Now()
			if err := f(); err != nil {
				t.Fatal(err)
			}
			ds = append(ds, time.Since(start))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		t.Logf("%s: median %s (min %s max %s)", name, ds[2], ds[0], ds[4])
	}
	measure("Stats, 1M due", func() error { _, err := st.Stats(ctx); return err })
	measure("MetricStats, 1M due", func() error { _, err := st.MetricStats(ctx); return err })
	measure("counts only", func() error {
		_, err := st.pool.Exec(ctx, `SELECT behavior, status, count(*) FROM stint_task GROUP BY behavior, status`)
		return err
	})
	measure("QueueLag", func() error { _, err := st.QueueLag(ctx); return err })
	// Claimed and finished: nothing due, the table still 1M rows.
	for _, q := range []string{`DELETE FROM stint_due`, `UPDATE stint_task SET status = 'success', schedule_not_before = NULL`, `VACUUM ANALYZE stint_task`} {
		if _, err := st.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	measure("MetricStats, 1M finished, none due", func() error { _, err := st.MetricStats(ctx); return err })
}
