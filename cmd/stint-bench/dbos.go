package main

// DBOS Transact for Go, the durable-workflow library on PostgreSQL, as a
// peer of the burn-down, streaming, latency and signals scenarios. Its
// runner (the directory dbos beside this file) is a Go module of its own,
// so that DBOS's dependencies stay out of stint's go.mod and `go test
// ./...`; the benchmark builds it with the go command into the user's
// cache folder on first use and runs it as child processes: a worker
// process that runs the no-op workflow from a queue, a client process that
// enqueues, and for the scenarios that time both ends one process with
// both.
//
// Tuned as DBOS's documentation says: the queue's worker concurrency set
// (a queue without one dequeues every enqueued workflow at once) to 1,000,
// stint's MaxWorkers and River's tuned MaxWorkers (100 burned down slower
// here), a unique executor ID per process, the queue's base polling
// interval lowered from its default of a second to the 20 ms River's
// tuning polls at, the notification coalescing interval at its minimum
// of 1 ms; its pool at its default of 20 connections, as stint's. The
// latency scenario also runs it at its defaults.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// sysDBOS names DBOS Transact for Go.
const sysDBOS = "dbos"

// dbosVersion is the DBOS Transact for Go release the runner's go.mod
// requires.
const dbosVersion = "v1.9.0"

// dbosRunnerFiles are the runner's sources, whose content names the build.
var dbosRunnerFiles = []string{"go.mod", "go.sum", "main.go"}

// errDBOSNotBuilt says the runner is not in the cache and was not to be
// built.
var errDBOSNotBuilt = errors.New("its runner is not built")

// dbosConfig is what DBOS's flags set.
type dbosConfig struct {
	src         string        // the runner's source directory
	poll        time.Duration // the queue's base polling interval, tuned
	concurrency int           // the queue's worker concurrency
	coalesce    time.Duration // NotificationCoalesceInterval, tuned
	noBuild     bool          // use a cached runner only (tests)
}

// addFlags adds DBOS's flags.
func (d *dbosConfig) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&d.src, "dbos-src", "", "`directory` of DBOS's runner module (default: cmd/stint-bench/dbos of the source tree this binary was built from)")
	fs.DurationVar(&d.poll, "dbos-poll", d.poll, "DBOS: the queue's base polling interval (WithQueueBasePollingInterval; DBOS's default 1s runs in the latency scenario's defaults row)")
	fs.IntVar(&d.concurrency, "dbos-concurrency", d.concurrency, "DBOS: the queue's worker concurrency (WithWorkerConcurrency)")
	fs.DurationVar(&d.coalesce, "dbos-coalesce", d.coalesce, "DBOS: Config.NotificationCoalesceInterval (its default 10ms; its minimum 1ms)")
}

// defaultDBOSConfig is DBOS's tuning.
func defaultDBOSConfig() dbosConfig {
	return dbosConfig{poll: 20 * time.Millisecond, concurrency: 1_000, coalesce: time.Millisecond}
}

// summary describes DBOS's tuning for the report.
func (d dbosConfig) summary() string {
	return fmt.Sprintf("DBOS Transact for Go %s (Go child processes): one worker process, queue WorkerConcurrency %d, base polling interval %s, NotificationCoalesceInterval %s, unique ExecutorID, pool at its default 20 conns; enqueues from a client process (dbos.Enqueue in one transaction per batch, WithEnqueueTransaction); latency: one process with the worker and a dbos.Client, defaults row: polling 1s, coalescing 10ms",
		dbosVersion, d.concurrency, d.poll, d.coalesce)
}

// args are the runner's flags, tuned or at DBOS's defaults.
func (d dbosConfig) args(defaults bool) []string {
	if defaults {
		return []string{"-concurrency", strconv.Itoa(d.concurrency)}
	}
	return []string{"-poll", d.poll.String(), "-concurrency", strconv.Itoa(d.concurrency), "-coalesce", d.coalesce.String()}
}

// dbosRunner returns the path of the built runner of the sources in src
// (the default when empty), building it with the go command into the
// user's cache folder unless it is there or noBuild is set
// (errDBOSNotBuilt then).
func dbosRunner(ctx context.Context, src string, noBuild bool, logf func(string, ...any)) (string, error) {
	if src == "" {
		_, file, _, ok := runtime.Caller(0)
		if !ok {
			return "", errors.New("cannot tell where its runner's source is: give --dbos-src")
		}
		src = filepath.Join(filepath.Dir(file), "dbos")
	}
	h := sha256.New()
	for _, f := range dbosRunnerFiles {
		raw, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", fmt.Errorf("read its runner's source (--dbos-src): %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", f, len(raw))
		h.Write(raw)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("find the cache folder: %w", err)
	}
	dir := filepath.Join(cache, "stint-bench")
	bin := filepath.Join(dir, "dbos-runner-"+hex.EncodeToString(h.Sum(nil)[:8]))
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if noBuild {
		return "", fmt.Errorf("%w at %s", errDBOSNotBuilt, bin)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", errors.New("building its runner needs the go command: none on PATH")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	logf("building DBOS's runner (%s) into %s", src, bin)
	tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
	bctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(bctx, goBin, "build", "-o", tmp, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("build its runner in %s: %w\n%s", src, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("move its runner into place: %w", err)
	}
	return bin, nil
}

// dbosAvailable returns DBOS's runner if the run needs it, or "" with a
// note when it cannot be had.
func (b *bench) dbosAvailable(ctx context.Context) string {
	if !b.cfg.has(sysDBOS) {
		return ""
	}
	bin, err := dbosRunner(ctx, b.cfg.dbos.src, b.cfg.dbos.noBuild, b.logf)
	if err != nil {
		b.rep.Notes = append(b.rep.Notes, "DBOS not run: "+err.Error())
		if b.warn != nil {
			fmt.Fprintf(b.warn, "stint-bench: DBOS not run, the others are: %v\n", err)
		}
		return ""
	}
	return bin
}

// startDBOS starts a runner process in mode on dsn.
func (b *bench) startDBOS(ctx context.Context, mode, dsn string, defaults bool, onRan func(int64)) (*child, error) {
	args := append([]string{mode, dsn}, b.cfg.dbos.args(defaults)...)
	if b.cfg.verbose {
		args = append(args, "-v")
	}
	p, err := startChild(ctx, exec.Command(b.dbosBin, args...), onRan)
	if err != nil {
		return nil, fmt.Errorf("dbos %s: %w", mode, err)
	}
	return p, nil
}

// dbosHarness runs DBOS: a client process enqueues, a worker process runs.
type dbosHarness struct {
	client, worker *child
	obs            *pgxpool.Pool
	pr             *probe
}

// newDBOS starts a worker process on dsn, which creates DBOS's schema, and
// then a client process; the worker launches DBOS on "go".
func (b *bench) newDBOS(ctx context.Context, dsn string) (h *dbosHarness, err error) {
	h = &dbosHarness{pr: &probe{}}
	opened := h
	defer func() {
		if err != nil {
			opened.close()
		}
	}()
	var last int64
	onRan := func(n int64) {
		h.pr.started.Add(n - last)
		last = n
	}
	if h.worker, err = b.startDBOS(ctx, "worker", dsn, false, onRan); err != nil {
		return nil, err
	}
	if h.client, err = b.startDBOS(ctx, "client", dsn, false, nil); err != nil {
		return nil, err
	}
	if h.obs, err = newObserver(ctx, dsn); err != nil {
		return nil, err
	}
	return h, nil
}

func (h *dbosHarness) insert(ctx context.Context, n int) error {
	if err := h.client.add(ctx, n, n); err != nil {
		return fmt.Errorf("dbos enqueue %d workflows: %w", n, err)
	}
	return nil
}

func (h *dbosHarness) insertOwn(ctx context.Context, n int) error {
	if err := h.worker.add(ctx, n, n); err != nil {
		return fmt.Errorf("dbos worker enqueue %d workflows: %w", n, err)
	}
	return nil
}

func (h *dbosHarness) start(context.Context) error {
	if err := h.worker.start(); err != nil {
		return fmt.Errorf("start dbos worker: %w", err)
	}
	return nil
}

func (h *dbosHarness) stop(context.Context) error {
	if h.worker == nil {
		return nil
	}
	err := h.worker.stop(time.Minute)
	h.worker = nil
	if err != nil {
		return fmt.Errorf("stop dbos worker: %w", err)
	}
	return nil
}

func (h *dbosHarness) close() {
	for _, p := range []*child{h.worker, h.client} {
		if p != nil {
			if err := p.stop(30 * time.Second); err != nil {
				p.kill()
			}
		}
	}
	if h.obs != nil {
		h.obs.Close()
	}
}

func (h *dbosHarness) probe() *probe           { return h.pr }
func (h *dbosHarness) observer() *pgxpool.Pool { return h.obs }
func (h *dbosHarness) queries() queries {
	return queries{
		pending:   `SELECT EXISTS (SELECT 1 FROM dbos.workflow_status WHERE status IN ('ENQUEUED', 'PENDING'))`,
		completed: `SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'`,
	}
}

var _ harness = (*dbosHarness)(nil)

// dbosBench starts a runner process with DBOS launched and a client, on a
// fresh database called label, at DBOS's defaults or tuned; stop ends it.
func (b *bench) dbosBench(ctx context.Context, label string, defaults bool) (p *child, stop func(), err error) {
	dsn, err := b.db.newDB(ctx, label)
	if err != nil {
		return nil, nil, err
	}
	if p, err = b.startDBOS(ctx, "bench", dsn, defaults, nil); err != nil {
		return nil, nil, err
	}
	return p, func() {
		if err := p.stop(time.Minute); err != nil {
			p.kill()
		}
	}, nil
}

// askDBOS sends a bench process a command and decodes its answer into v.
func askDBOS(ctx context.Context, p *child, cmd string, v any) error {
	answer, err := p.ask(ctx, cmd)
	if err != nil {
		return fmt.Errorf("dbos: %w", err)
	}
	if err := json.Unmarshal([]byte(answer), v); err != nil {
		return fmt.Errorf("dbos: %s answered %q: %w", cmd, answer, err)
	}
	return nil
}

// durations turns the runner's microseconds into durations.
func durations(us []int64) []time.Duration {
	out := make([]time.Duration, len(us))
	for i, u := range us {
		out[i] = time.Duration(u) * time.Microsecond
	}
	return out
}

// latencyDBOS runs DBOS's latency, at its defaults or tuned: single
// enqueues at the latency rate from a client in the worker's process.
func (b *bench) latencyDBOS(ctx context.Context, defaults bool) ([]Result, error) {
	label, system := "latency_dbos_tuned", sysDBOS+" (tuned)"
	if defaults {
		label, system = "latency_dbos_defaults", sysDBOS+" (defaults)"
	}
	p, stop, err := b.dbosBench(ctx, label, defaults)
	if err != nil {
		return nil, err
	}
	defer stop()
	win := begin()
	var got struct{ Stored, Start, Await []int64 }
	if err := askDBOS(ctx, p, fmt.Sprintf("latency %d %d", b.cfg.latRate, b.total()), &got); err != nil {
		return nil, err
	}
	cpu := win.usage()
	w := b.warmup()
	if len(got.Stored) != b.total() || len(got.Start) != b.total() || len(got.Await) != b.total() {
		return nil, fmt.Errorf("dbos: latency answered %d, %d and %d samples, want %d", len(got.Stored), len(got.Start), len(got.Await), b.total())
	}
	n := int64(b.total() - w)
	return []Result{
		{Scenario: "latency", Metric: "submit->stored", System: system, Tasks: n, samples: durations(got.Stored[w:]), CPU: cpu},
		{Scenario: "latency", Metric: "submit->start", System: system, Tasks: n, samples: durations(got.Start[w:]), CPU: cpu},
		{Scenario: "latency", Metric: "submit->await", System: system, Tasks: n, samples: durations(got.Await[w:]), CPU: cpu},
	}, nil
}
