package soak

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The goals' bounds.
const (
	// throughputSlack is how far from the rate the throughput of each
	// sample of the last half may be, as a fraction of the rate.
	throughputSlack = 0.05
	// p99Drift bounds the p99 of the last third, as a multiple of the
	// first third's.
	p99Drift = 1.2
	// flatSlack is how much a node's RSS or a relation's size may grow
	// over the last half, as a fraction: the most in the last quarter
	// against the most in the quarter before (peaks, as a table shrinks
	// when vacuum cuts its empty end, and refills).
	flatSlack = 0.10
	// flatBytes is the growth of a relation that passes whatever its
	// size: the few pages a small table or index moves by.
	flatBytes = 1 << 20
	// deadGrowth and deadSlack bound the dead tuples of each table: the
	// most in the last third at most deadGrowth times the most in the
	// middle third, plus deadSlack.
	deadGrowth = 1.5
	deadSlack  = 1000
)

// goal is one goal's verdict.
type goal struct {
	name   string
	ok     bool
	detail string
}

// goals checks the series against the soak's goals at rate (tasks a
// second): over the last half, each sample's throughput within 5% of the
// rate and every node's RSS and every relation's size flat within 10%
// (the most of the last quarter against the most of the third);
// the p99 of submit to start over the last third within 1.2 times the
// first third's; each table's dead tuples not growing from the middle
// third to the last; and no sample finding a task kept past its retention
// plus the bound.
func goals(samples []sample, rate float64) []goal {
	n := len(samples)
	if n < 3 {
		return []goal{{name: "samples", detail: fmt.Sprintf("%d samples; the goals need at least 3", n)}}
	}
	half := samples[n/2:]
	third, fourth := half[:len(half)/2], half[len(half)/2:]
	first, middle, last := samples[:n/3], samples[n/3:n-n/3], samples[n-n/3:]
	// peak is the most of v over ss.
	peak := func(ss []sample, v func(sample) int64) int64 {
		var m int64
		for _, s := range ss {
			m = max(m, v(s))
		}
		return m
	}
	var out []goal

	lo, hi := rate, rate
	for _, s := range half {
		lo, hi = min(lo, s.throughput()), max(hi, s.throughput())
	}
	out = append(out, goal{name: "throughput", ok: lo >= rate*(1-throughputSlack) && hi <= rate*(1+throughputSlack),
		detail: fmt.Sprintf("last half %.1f..%.1f/s against %.0f/s (within %.0f%%)", lo, hi, rate, 100*throughputSlack)})

	latencies := func(ss []sample) []int64 {
		var l []int64
		for _, s := range ss {
			l = append(l, s.Latencies...)
		}
		return l
	}
	p1, p3 := p99(latencies(first)), p99(latencies(last))
	out = append(out, goal{name: "p99", ok: float64(p3) <= p99Drift*float64(p1),
		detail: fmt.Sprintf("submit to start p99 %s in the first third, %s in the last (at most %.1fx)",
			p1.Round(time.Millisecond), p3.Round(time.Millisecond), p99Drift)})

	for i := range half[0].RSS {
		rss := func(s sample) int64 { return s.RSS[i] }
		p3, p4 := peak(third, rss), peak(fourth, rss)
		out = append(out, goal{name: fmt.Sprint("rss node-", i), ok: float64(p4) <= (1+flatSlack)*float64(p3),
			detail: fmt.Sprintf("most %.1f MB in the third quarter, %.1f MB in the last", float64(p3)/mb, float64(p4)/mb)})
	}

	var grew []string
	relations := func(s sample) map[string]int64 {
		m := maps.Clone(s.Tables)
		maps.Copy(m, s.Indexes)
		return m
	}
	for _, name := range slices.Sorted(maps.Keys(relations(half[0]))) {
		size := func(s sample) int64 { return relations(s)[name] }
		p3, p4 := peak(third, size), peak(fourth, size)
		if p4-p3 > max(int64(flatSlack*float64(p3)), flatBytes) {
			grew = append(grew, fmt.Sprintf("%s %.1f -> %.1f MB", name, float64(p3)/mb, float64(p4)/mb))
		}
	}
	out = append(out, goal{name: "relation sizes", ok: len(grew) == 0,
		detail: fmt.Sprintf("most in the last quarter over the third's by more than %.0f%% (or 1 MiB): %v", 100*flatSlack, grew)})

	var rising []string
	for _, table := range slices.Sorted(maps.Keys(last[0].Dead)) {
		dead := func(s sample) int64 { return s.Dead[table] }
		m, l := peak(middle, dead), peak(last, dead)
		if float64(l) > deadGrowth*float64(m)+deadSlack {
			rising = append(rising, fmt.Sprintf("%s %d -> %d", table, m, l))
		}
	}
	out = append(out, goal{name: "dead tuples", ok: len(rising) == 0,
		detail: fmt.Sprintf("tables whose most dead tuples grew from the middle third to the last: %v", rising)})

	var late int64
	var longest time.Duration
	for _, s := range samples {
		late = max(late, s.Late)
		longest = max(longest, s.MaxLate)
	}
	out = append(out, goal{name: "retention", ok: late == 0,
		detail: fmt.Sprintf("at most %d tasks kept past their retention plus the bound at a sample; the longest kept %s past it",
			late, longest.Round(time.Second))})
	return out
}

func TestGoals(t *testing.T) {
	flat := func(i int) sample {
		return sample{Seconds: 30, Done: 9000, Latencies: []int64{10_000, 20_000},
			RSS: []int64{40 * mb}, Tables: map[string]int64{"stint_task": 10 * mb}, Indexes: map[string]int64{"stint_task_pkey": 2 * mb},
			Dead: map[string]int64{"stint_task": 4000}}
	}
	series := func(change func(i int, s *sample)) []sample {
		out := make([]sample, 12)
		for i := range out {
			out[i] = flat(i)
			if change != nil {
				change(i, &out[i])
			}
		}
		return out
	}
	failed := func(gs []goal) []string {
		var names []string
		for _, g := range gs {
			if !g.ok {
				names = append(names, g.name)
			}
		}
		return names
	}
	for _, tc := range []struct {
		name   string
		change func(i int, s *sample)
		want   []string
	}{
		{"flat", nil, nil},
		{"throughput falls behind", func(i int, s *sample) {
			if i == 10 {
				s.Done = 8000
			}
		}, []string{"throughput"}},
		{"p99 drifts", func(i int, s *sample) {
			if i >= 8 {
				s.Latencies = []int64{10_000, 30_000}
			}
		}, []string{"p99"}},
		{"rss grows", func(i int, s *sample) { s.RSS[0] += int64(i) * 3 * mb }, []string{"rss node-0"}},
		{"rss goes up and down", func(i int, s *sample) { s.RSS[0] += int64(i%2) * 6 * mb }, nil},
		{"the feed grows", func(i int, s *sample) {
			s.Tables = map[string]int64{"stint_task": 10 * mb, "stint_change": int64(i) * 4 * mb}
		},
			[]string{"relation sizes"}},
		{"a small index moves by pages", func(i int, s *sample) { s.Indexes["stint_hold_pkey"] = int64(8192 * (1 + i%3)) }, nil},
		{"a table shrinks and refills", func(i int, s *sample) { s.Tables["stint_attempt"] = int64(1+i%3) * 4 * mb }, nil},
		{"dead tuples rise", func(i int, s *sample) { s.Dead["stint_attempt"] = int64(i) * 3000 }, []string{"dead tuples"}},
		{"a task kept too long", func(i int, s *sample) {
			if i == 5 {
				s.Late = 1
			}
		}, []string{"retention"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, failed(goals(series(tc.change), 300)))
		})
	}
}
