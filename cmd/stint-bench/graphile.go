package main

// Graphile Worker, the Node.js queue on PostgreSQL, as a second peer. The
// benchmark installs the npm package graphile-worker into a cache folder on
// first use and runs it in Node.js processes of its own (graphile_runner.cjs,
// embedded here), tuned as Graphile Worker's performance documentation
// says: per process 24 concurrent jobs, a pool of 25 connections, a local
// queue of 500 jobs and job completions batched with no delay. Jobs are
// added with batched addJobs calls from a client process.

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// sysGraphile names Graphile Worker.
const sysGraphile = "graphile"

// graphileVersion is the graphile-worker release the benchmark installs:
// the newest that runs on Node.js 14 and later (0.18 needs Node.js 22.18).
const graphileVersion = "0.17.3"

//go:embed graphile_runner.cjs
var graphileRunner []byte

// npmInstall is an installed npm package of a peer and the runner script
// next to its node_modules.
type npmInstall struct {
	node   string // the node binary
	runner string // the runner script's path
}

// installGraphile returns graphile-worker installed under the user's cache
// folder, installing it with npm on first use; see installNPM.
func installGraphile(ctx context.Context, logf func(string, ...any)) (*npmInstall, error) {
	return installNPM(ctx, logf, "Graphile Worker", "graphile-worker", graphileVersion, graphileRunner, ".cjs")
}

// installNPM returns the npm package pkg@version (the peer called name)
// installed under the user's cache folder (os.UserCacheDir, e.g.
// $XDG_CACHE_HOME or ~/.cache), installing it with npm on first use, with
// runner written next to it as a script of the extension ext. It fails
// with a clear error where Node.js or npm is missing.
func installNPM(ctx context.Context, logf func(string, ...any), name, pkg, version string, runner []byte, ext string) (*npmInstall, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("%s needs Node.js: no node on PATH", name)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return nil, fmt.Errorf("%s: find the cache folder: %w", name, err)
	}
	parent := filepath.Join(cache, "stint-bench")
	dir := filepath.Join(parent, pkg+"-"+version)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
		npm, err := exec.LookPath("npm")
		if err != nil {
			return nil, fmt.Errorf("%s needs npm to install it: no npm on PATH", name)
		}
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		// Install into a folder of its own and rename it into place, so
		// that a broken or concurrent install never leaves half a folder
		// behind at dir.
		tmp, err := os.MkdirTemp(parent, "install-")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		defer os.RemoveAll(tmp)
		manifest := `{"private": true, "dependencies": {"` + pkg + `": "` + version + `"}}` + "\n"
		if err := os.WriteFile(filepath.Join(tmp, "package.json"), []byte(manifest), 0o644); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		logf("installing %s %s with npm into %s", pkg, version, dir)
		ictx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ictx, npm, "install", "--no-audit", "--no-fund", "--omit=dev", "--loglevel=error")
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s: npm install %s@%s: %w\n%s", name, pkg, version, err, strings.TrimSpace(string(out)))
		}
		if err := os.Rename(tmp, dir); err != nil {
			if _, serr := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); serr != nil {
				return nil, fmt.Errorf("%s: move the install into place: %w", name, err)
			}
			// Another process installed it meanwhile.
		}
	}
	// The runner is named by its content, so that a changed runner never
	// meets an old file of the same name.
	sum := sha256.Sum256(runner)
	path := filepath.Join(dir, "stint-bench-runner-"+hex.EncodeToString(sum[:6])+ext)
	if _, err := os.Stat(path); err != nil {
		tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
		if err := os.WriteFile(tmp, runner, 0o644); err != nil {
			return nil, fmt.Errorf("%s: write the runner: %w", name, err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return nil, fmt.Errorf("%s: write the runner: %w", name, err)
		}
	}
	return &npmInstall{node: node, runner: path}, nil
}

// graphileHarness runs Graphile Worker: a client process adds jobs, worker
// processes run them.
type graphileHarness struct {
	client    *child
	workers   []*child
	obs       *pgxpool.Pool
	pr        *probe
	completed string
}

// newGraphile starts a client process on dsn, which installs Graphile
// Worker's schema (its own migrations), and the given number of worker
// processes, which wait for "go".
func newGraphile(ctx context.Context, inst *npmInstall, dsn string, workers int) (h *graphileHarness, err error) {
	h = &graphileHarness{pr: &probe{}}
	// A failed return sets h to nil: close what was opened through its
	// own pointer.
	opened := h
	defer func() {
		if err != nil {
			opened.close()
		}
	}()
	if h.client, err = startChild(ctx, exec.Command(inst.node, inst.runner, "client", dsn), nil); err != nil {
		return nil, fmt.Errorf("graphile client: %w", err)
	}
	for range workers {
		// Each process reports its running total; the probe adds them up.
		var last int64
		onRan := func(n int64) {
			h.pr.started.Add(n - last)
			last = n
		}
		w, err := startChild(ctx, exec.Command(inst.node, inst.runner, "worker", dsn), onRan)
		if err != nil {
			return nil, fmt.Errorf("graphile worker: %w", err)
		}
		h.workers = append(h.workers, w)
	}
	if h.obs, err = newObserver(ctx, dsn); err != nil {
		return nil, err
	}
	// Graphile Worker deletes a job when it completes: the jobs completed
	// are the ids handed out less the jobs left.
	var seq string
	if err := h.obs.QueryRow(ctx, `SELECT pg_get_serial_sequence('graphile_worker._private_jobs', 'id')`).Scan(&seq); err != nil {
		return nil, fmt.Errorf("graphile: find the jobs' id sequence: %w", err)
	}
	h.completed = fmt.Sprintf(`SELECT (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM %s) - (SELECT count(*) FROM graphile_worker._private_jobs)`, seq)
	return h, nil
}

func (h *graphileHarness) insert(ctx context.Context, n int) error {
	if err := h.client.add(ctx, n, n); err != nil {
		return fmt.Errorf("graphile add %d jobs: %w", n, err)
	}
	return nil
}

// insertOwn adds the jobs through the first worker process's own pool.
func (h *graphileHarness) insertOwn(ctx context.Context, n int) error {
	if err := h.workers[0].add(ctx, n, n); err != nil {
		return fmt.Errorf("graphile worker add %d jobs: %w", n, err)
	}
	return nil
}

func (h *graphileHarness) start(context.Context) error {
	for _, w := range h.workers {
		if err := w.start(); err != nil {
			return fmt.Errorf("start graphile worker: %w", err)
		}
	}
	return nil
}

func (h *graphileHarness) stop(context.Context) error {
	var errs []error
	for _, w := range h.workers {
		errs = append(errs, w.stop(time.Minute))
	}
	h.workers = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop graphile workers: %w", err)
	}
	return nil
}

func (h *graphileHarness) close() {
	for _, w := range h.workers {
		w.kill()
	}
	if h.client != nil {
		if err := h.client.stop(30 * time.Second); err != nil {
			h.client.kill()
		}
	}
	if h.obs != nil {
		h.obs.Close()
	}
}

func (h *graphileHarness) probe() *probe           { return h.pr }
func (h *graphileHarness) observer() *pgxpool.Pool { return h.obs }
func (h *graphileHarness) queries() queries {
	return queries{
		// A job is in the table until it completes (or fails for good,
		// which a no-op does not).
		pending:   `SELECT EXISTS (SELECT 1 FROM graphile_worker._private_jobs)`,
		completed: h.completed,
	}
}

// ensure graphileHarness stays a harness.
var _ harness = (*graphileHarness)(nil)

// graphileAvailable installs Graphile Worker if the run needs it and
// returns it, or nil with a note when it cannot be had.
func (b *bench) graphileAvailable(ctx context.Context) *npmInstall {
	if !b.cfg.has(sysGraphile) {
		return nil
	}
	inst, err := installGraphile(ctx, b.logf)
	if err != nil {
		b.rep.Notes = append(b.rep.Notes, "Graphile Worker not run: "+err.Error())
		if b.warn != nil {
			fmt.Fprintf(b.warn, "stint-bench: Graphile Worker not run, the others are: %v\n", err)
		}
		return nil
	}
	return inst
}
