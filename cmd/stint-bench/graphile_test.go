package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/provision"
)

// nodeJS is Node.js with npm, which Graphile Worker runs on; Debian's npm
// package brings both.
var nodeJS = provision.Tool{Name: "Node.js and npm", Package: "npm", Find: func() (string, error) {
	if _, err := exec.LookPath("node"); err != nil {
		return "", err
	}
	return exec.LookPath("npm")
}}

// TestGraphile runs every throughput scenario of Graphile Worker at a tiny
// size (installing it into the cache folder if it is not there yet) and
// checks that the counts add up and that stint's ratios to it are there.
func TestGraphile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	provision.Require(t, ctx, nodeJS)

	cfg := defaultConfig()
	cfg.systems = "stint,graphile"
	cfg.burndown, cfg.streaming, cfg.burst, cfg.drainBurst, cfg.scale = true, true, true, true, true
	const n = 400
	cfg.n, cfg.scaleN, cfg.burstN = n, n, n
	cfg.batch, cfg.burstBatch, cfg.drainCycles = 150, 150, 2
	// The warm-up lets the Node.js workers start before the window.
	cfg.streamDur, cfg.streamWarmup = time.Second, 2*time.Second
	cfg.streamBatch, cfg.streamBacklog = 100, 400
	cfg.scaleNodes = []int{1, 2}
	cfg.timeout = 2 * time.Minute
	cfg.runs = 1

	rep, err := newTestBench(t, cfg).run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Notes) > 0 {
		t.Errorf("notes: %q", rep.Notes)
	}
	got := map[string]Result{}
	for _, r := range rep.Results {
		if r.Error != "" {
			t.Errorf("%s %s: %s", r.Scenario, r.System, r.Error)
		}
		got[fmt.Sprint(r.Scenario, "|", r.Metric, "|", r.System, "|", r.Nodes)] = r
	}
	for _, c := range []struct {
		scenario, metric string
		nodes            int
		tasks            int64 // 0: some
	}{
		{"burn-down", "insert", 0, n}, {"burn-down", "work", 0, n},
		{"streaming", "work", 0, 0}, {scenarioStreamingClient, "work", 0, 0},
		{"burst", "work", 0, n}, {"drain-burst", "work", 0, 2 * n},
		{"scale", "work", 1, n}, {"scale", "work", 2, n},
	} {
		r, ok := got[fmt.Sprint(c.scenario, "|", c.metric, "|", sysGraphile, "|", c.nodes)]
		if !ok {
			t.Errorf("no Graphile Worker row for %s %s (%d nodes)", c.scenario, c.metric, c.nodes)
			continue
		}
		if r.PerSec <= 0 || (c.tasks > 0 && r.Tasks != c.tasks) || (c.tasks == 0 && r.Tasks <= 0) {
			t.Errorf("%s %s graphile: %d tasks at %.0f/s, want %d at > 0", c.scenario, c.metric, r.Tasks, r.PerSec, c.tasks)
		}
		if r.StintRatio <= 0 {
			t.Errorf("%s %s graphile: no stint ratio", c.scenario, c.metric)
		}
	}
	var table bytes.Buffer
	rep.writeTable(&table)
	t.Log("\n" + table.String())
	if !strings.Contains(table.String(), "graphile-worker "+graphileVersion) {
		t.Errorf("table does not say which Graphile Worker ran")
	}
}

// TestGraphileMissingNode checks that without Node.js the benchmark says
// so and runs the other systems.
func TestGraphileMissingNode(t *testing.T) {
	pgtest.New(t)
	t.Setenv("PATH", t.TempDir())
	var out, errs bytes.Buffer
	code := run([]string{"--db", pgtest.AdminDSN(), "--burndown", "--systems", "stint,graphile", "--n", "200", "--runs", "1", "--json"}, &out, &errs)
	if code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, errs.String())
	}
	if !strings.Contains(errs.String(), "Graphile Worker not run, the others are: Graphile Worker needs Node.js: no node on PATH") {
		t.Errorf("stderr does not say Graphile Worker was left out for want of Node.js:\n%s", errs.String())
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("decode the JSON report: %v\n%s", err, out.String())
	}
	systems := map[string]bool{}
	for _, r := range rep.Results {
		systems[r.System] = true
	}
	if !systems[sysStint] || systems[sysGraphile] || len(rep.Results) != 2 {
		t.Errorf("results: %+v, want stint's burn-down insert and work only", rep.Results)
	}
	if len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "no node on PATH") {
		t.Errorf("notes: %q, want the reason Graphile Worker did not run", rep.Notes)
	}
}
