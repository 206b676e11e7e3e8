package soak

import (
	"encoding/csv"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
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
	return fmt.Sprintf("%6s %5s %6s %6s %6s %9s %9s %9s %7s %7s %7s %8s %8s %8s %8s %6s %8s %8s %6s %7s",
		"t", "load", "sub/s", "done/s", "p99ms", per("rssMB"), per("gor"), per("cpu%"),
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
	walPerTask := int64(0)
	if done := s.Done + s.Nodes + s.Ticks; done > 0 {
		walPerTask = s.WAL / done
	}
	return fmt.Sprintf("%6s %5.1f %6.0f %6.0f %6.0f %9s %9s %9s %7.1f %7.1f %7.1f %8d %8d %8d %8d %6d %8d %8d %6d %7s",
		s.At.Round(time.Second), s.Load1, float64(s.Submitted)/s.Seconds, s.throughput(), float64(p99(s.Latencies))/float64(time.Millisecond),
		join(func(i int) string { return fmt.Sprint(s.RSS[i] / mb) }, n),
		join(func(i int) string { return fmt.Sprint(s.Goroutines[i]) }, n),
		join(func(i int) string { return fmt.Sprintf("%.0f", 100*s.CPU[i]/s.Seconds) }, n),
		float64(sum(s.Tables))/mb, float64(sum(s.Indexes))/mb, float64(s.FeedBytes)/mb, s.FeedRows,
		s.Dead["stint_task"], s.Dead["stint_attempt"], maxValue(s.Dead), sum(s.Vacuums), walPerTask,
		s.Finished, s.Late, s.MaxLate.Round(time.Second))
}

func maxValue(m map[string]int64) int64 {
	var v int64
	for _, x := range m {
		v = max(v, x)
	}
	return v
}

// writeCSV writes the samples as CSV: a row a sample, with every
// relation's size and every table's dead and live tuples and autovacuum
// runs in columns of their own.
func writeCSV(w io.Writer, samples []sample) error {
	if len(samples) == 0 {
		return nil
	}
	nodes := len(samples[0].RSS)
	names := func(pick func(sample) map[string]int64) []string {
		set := map[string]bool{}
		for _, s := range samples {
			for k := range pick(s) {
				set[k] = true
			}
		}
		return slices.Sorted(maps.Keys(set))
	}
	groups := []struct {
		prefix string
		pick   func(sample) map[string]int64
	}{
		{"size:", func(s sample) map[string]int64 { return s.Tables }},
		{"size:", func(s sample) map[string]int64 { return s.Indexes }},
		{"dead:", func(s sample) map[string]int64 { return s.Dead }},
		{"live:", func(s sample) map[string]int64 { return s.Live }},
		{"autovacuums:", func(s sample) map[string]int64 { return s.Vacuums }},
	}
	head := []string{"at_s", "seconds", "load1", "submitted_per_s", "done_per_s", "nodes_done", "ticks_done", "p99_ms"}
	for i := range nodes {
		head = append(head, fmt.Sprint("rss_bytes_", i), fmt.Sprint("goroutines_", i), fmt.Sprint("cpu_s_", i))
	}
	head = append(head, "wal_bytes", "wal_bytes_per_task", "feed_bytes", "feed_rows", "finished", "late", "max_late_s")
	cols := make([][]string, len(groups))
	for i, g := range groups {
		cols[i] = names(g.pick)
		for _, name := range cols[i] {
			head = append(head, g.prefix+name)
		}
	}
	cw := csv.NewWriter(w)
	if err := cw.Write(head); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	d := func(v int64) string { return strconv.FormatInt(v, 10) }
	for _, s := range samples {
		rec := []string{f(s.At.Seconds()), f(s.Seconds), f(s.Load1), f(float64(s.Submitted) / s.Seconds), f(s.throughput()),
			d(s.Nodes), d(s.Ticks), f(float64(p99(s.Latencies)) / float64(time.Millisecond))}
		for i := range nodes {
			rec = append(rec, d(s.RSS[i]), strconv.Itoa(s.Goroutines[i]), f(s.CPU[i]))
		}
		perTask := int64(0)
		if done := s.Done + s.Nodes + s.Ticks; done > 0 {
			perTask = s.WAL / done
		}
		rec = append(rec, d(s.WAL), d(perTask), d(s.FeedBytes), d(s.FeedRows), d(s.Finished), d(s.Late), f(s.MaxLate.Seconds()))
		for i, g := range groups {
			m := g.pick(s)
			for _, name := range cols[i] {
				if v, ok := m[name]; ok {
					rec = append(rec, d(v))
				} else {
					rec = append(rec, "")
				}
			}
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
