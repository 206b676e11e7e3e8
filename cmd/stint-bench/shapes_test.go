package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestShapeIdeal checks each shape's ideal: the throughput its limits
// allow, none where the machine bounds it first.
func TestShapeIdeal(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, c := range []struct {
		name string
		s    shape
		want float64
	}{
		{"no-op", shape{nodes: 1, kinds: []shapeKind{{dur: 0, n: 100}}}, 0},
		{"10ms, no cap: above what the machine does", shape{nodes: 1, kinds: []shapeKind{{dur: 10 * ms, n: 100}}}, 0},
		{"100ms, no cap", shape{nodes: 1, kinds: []shapeKind{{dur: 100 * ms, n: 100}}}, 10_000},
		{"10ms, cap 8", shape{nodes: 1, kinds: []shapeKind{{dur: 10 * ms, cap: 8, n: 100}}}, 800},
		{"10ms, cap 8, 3 nodes", shape{nodes: 3, kinds: []shapeKind{{dur: 10 * ms, cap: 8, n: 100}}}, 2_400},
		{"group keys: a cap across nodes", shape{nodes: 3, kinds: []shapeKind{{dur: 10 * ms, groupCap: 4, keys: 16, n: 100}}}, 6_400},
		{"two behaviors: all tasks over the slower one's time", shape{nodes: 1, kinds: []shapeKind{
			{dur: 10 * ms, cap: 8, n: 1_600}, // 2 s
			{dur: 0, n: 400},                 // no bound
		}}, 1_000},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.InDelta(t, c.want, c.s.ideal(1000), 0.001)
		})
	}
	require.False(t, shape{kinds: []shapeKind{{groupCap: 4, keys: 16}}}.riverExpresses(), "River has no cap per group key")
	require.True(t, shape{kinds: []shapeKind{{cap: 8}}}.riverExpresses())
}

// TestShapes runs the shapes of MaxConcurrency 64 on one node, small, on
// stint and River, each rated against its ideal and stint against River.
func TestShapes(t *testing.T) {
	cfg := defaultConfig()
	cfg.shapes, cfg.shapesN, cfg.shapesMatch = true, 300, "MaxConcurrency 64, backlog, 1 node"
	cfg.systems = "stint,river"
	cfg.timeout = time.Minute
	cfg.runs = 1
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := newTestBench(t, cfg).run(ctx)
	require.NoError(t, err)
	rows := map[string]Result{}
	for _, r := range rep.Results {
		require.Empty(t, r.Error, "%s %s", r.Scenario, r.System)
		rows[r.Scenario+" "+r.System] = r
	}
	require.Len(t, rows, 6, "three shapes match, each on both systems: %v", rows)
	capped := rows["shape: 10ms runs, MaxConcurrency 64, backlog, 1 node stint"]
	require.Equal(t, int64(300), capped.Tasks)
	require.InDelta(t, 6_400, capped.Bound, 0.001)
	require.Positive(t, capped.BoundRatio)
	require.Positive(t, rows["shape: 10ms runs, MaxConcurrency 64, backlog, 1 node river"].StintRatio)
}
