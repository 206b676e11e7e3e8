package soak

import (
	"encoding/csv"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const mb = 1 << 20

// header and row make the sampler's log: a line a sample.
func header(nodes int) string {
	per := func(name string) string {
		var parts []string
		for i := range nodes {
			parts = append(parts, fmt.Sprint(name, i))
		}
		return strings.Join(parts, "/")
	}
	return fmt.Sprintf("%6s %5s %6s %6s %6s %9s %9s %9s %5s %7s %7s %7s %8s %8s %8s %8s %6s %8s %8s %6s %7s",
		"t", "load", "sub/s", "done/s", "p99ms", per("rssMB"), per("gor"), per("cpu%"), "pg%",
		"tblMB", "idxMB", "feedMB", "feedrows", "deadTask", "deadAtt", "deadMax", "vacs", "WAL/task", "finished", "late", "maxlate")
}

func row(s sample) string {
	join := func(f func(i int) string, n int) string {
		var parts []string
		for i := range n {
			parts = append(parts, f(i))
		}
		return strings.Join(parts, "/")
	}
	n := len(s.RSS)
	return fmt.Sprintf("%6s %5.1f %6.0f %6.0f %6.0f %9s %9s %9s %5.0f %7.1f %7.1f %7.1f %8d %8d %8d %8d %6d %8d %8d %6d %7s",
		s.At.Round(time.Second), s.Load1, float64(s.Submitted)/s.Seconds, s.throughput(), float64(p99(s.Latencies))/float64(time.Millisecond),
		join(func(i int) string { return fmt.Sprint(s.RSS[i] / mb) }, n),
		join(func(i int) string { return fmt.Sprint(s.Goroutines[i]) }, n),
		join(func(i int) string { return fmt.Sprintf("%.0f", 100*s.CPU[i]/s.Seconds) }, n), 100*s.PGCPU/s.Seconds,
		float64(sum(s.Tables))/mb, float64(sum(s.Indexes))/mb, float64(s.FeedBytes)/mb, s.FeedRows,
		s.Dead["stint_task"], s.Dead["stint_attempt"], maxValue(s.Dead), sum(s.Vacuums), s.walPerTask(),
		s.Finished, s.Late, s.MaxLate.Round(time.Second))
}

// walPerTask is the WAL written a task done (of the mix, nodes and ticks).
func (s sample) walPerTask() int64 {
	if done := s.Done + s.Nodes + s.Ticks; done > 0 {
		return s.WAL / done
	}
	return 0
}

func maxValue(m map[string]int64) int64 {
	var v int64
	for _, x := range m {
		v = max(v, x)
	}
	return v
}

// csvLog writes the samples as CSV as they come: a row a sample, with
// every relation's size and every table's dead and live tuples and
// autovacuum runs in columns of their own, named after the first sample's.
type csvLog struct {
	w     *csv.Writer
	nodes int
	cols  [][]string // the names of each group's columns
}

// csvGroups are the columns of a relation or a table, a group per measure.
var csvGroups = []struct {
	prefix string
	pick   func(sample) map[string]int64
}{
	{"size:", func(s sample) map[string]int64 { return s.Tables }},
	{"size:", func(s sample) map[string]int64 { return s.Indexes }},
	{"dead:", func(s sample) map[string]int64 { return s.Dead }},
	{"live:", func(s sample) map[string]int64 { return s.Live }},
	{"autovacuums:", func(s sample) map[string]int64 { return s.Vacuums }},
}

// write writes s, after the header when it is the first.
func (l *csvLog) write(s sample) error {
	if l.cols == nil {
		l.nodes = len(s.RSS)
		head := []string{"at_s", "seconds", "load1", "submitted_per_s", "done_per_s", "nodes_done", "ticks_done", "p99_ms"}
		for i := range l.nodes {
			head = append(head, fmt.Sprint("rss_bytes_", i), fmt.Sprint("heap_bytes_", i), fmt.Sprint("goroutines_", i), fmt.Sprint("cpu_s_", i))
		}
		head = append(head, "pg_cpu_s", "wal_bytes", "wal_bytes_per_task", "feed_bytes", "feed_rows", "finished", "late", "max_late_s")
		for _, g := range csvGroups {
			names := slices.Sorted(maps.Keys(g.pick(s)))
			l.cols = append(l.cols, names)
			for _, name := range names {
				head = append(head, g.prefix+name)
			}
		}
		if err := l.w.Write(head); err != nil {
			return err
		}
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	d := func(v int64) string { return strconv.FormatInt(v, 10) }
	rec := []string{f(s.At.Seconds()), f(s.Seconds), f(s.Load1), f(float64(s.Submitted) / s.Seconds), f(s.throughput()),
		d(s.Nodes), d(s.Ticks), f(float64(p99(s.Latencies)) / float64(time.Millisecond))}
	for i := range l.nodes {
		rec = append(rec, d(s.RSS[i]), d(s.Heap[i]), strconv.Itoa(s.Goroutines[i]), f(s.CPU[i]))
	}
	rec = append(rec, f(s.PGCPU), d(s.WAL), d(s.walPerTask()), d(s.FeedBytes), d(s.FeedRows), d(s.Finished), d(s.Late), f(s.MaxLate.Seconds()))
	for i, g := range csvGroups {
		m := g.pick(s)
		for _, name := range l.cols[i] {
			if v, ok := m[name]; ok {
				rec = append(rec, d(v))
			} else {
				rec = append(rec, "")
			}
		}
	}
	if err := l.w.Write(rec); err != nil {
		return err
	}
	l.w.Flush()
	return l.w.Error()
}

func TestCSVLog(t *testing.T) {
	var b strings.Builder
	l := &csvLog{w: csv.NewWriter(&b)}
	s := sample{At: 30 * time.Second, Seconds: 30, Done: 9000, WAL: 9000 * 3000, RSS: []int64{mb}, Heap: []int64{mb / 2}, Goroutines: []int{40}, CPU: []float64{4.5},
		Tables: map[string]int64{"stint_task": 10 * mb}, Indexes: map[string]int64{"stint_task_pkey": mb},
		Dead: map[string]int64{"stint_task": 7}, Live: map[string]int64{"stint_task": 70}, Vacuums: map[string]int64{"stint_task": 1}}
	require.NoError(t, l.write(s))
	s.At = time.Minute
	delete(s.Dead, "stint_task")
	require.NoError(t, l.write(s))
	recs, err := csv.NewReader(strings.NewReader(b.String())).ReadAll()
	require.NoError(t, err)
	require.Len(t, recs, 3)
	col := func(name string) int { return slices.Index(recs[0], name) }
	require.Equal(t, "300", recs[1][col("done_per_s")])
	require.Equal(t, "3000", recs[1][col("wal_bytes_per_task")])
	require.Equal(t, "1048576", recs[1][col("size:stint_task_pkey")])
	require.Equal(t, "7", recs[1][col("dead:stint_task")])
	require.Equal(t, "", recs[2][col("dead:stint_task")], "a measure missing from a sample is left empty")
	require.Equal(t, "60", recs[2][col("at_s")])
}
