package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuTimes are the machine's CPU times from /proc/stat and the CPU time of
// this process's tree (itself, its node processes and the PostgreSQL
// processes it started), in clock ticks.
type cpuTimes struct {
	busy, steal, total uint64
	tree               map[int]procCPU // CPU time per process of the tree
	ok                 bool
}

// procCPU is the CPU time of one process, in clock ticks, and whether it is
// a PostgreSQL process (the server, its backends and helpers) rather than
// a Go one (this benchmark with the system it runs in-process, or a node
// process).
type procCPU struct {
	ticks uint64
	db    bool
}

// ticksPerSecond is the clock tick of /proc's CPU times (USER_HZ), 100 on
// every Linux architecture Go supports.
const ticksPerSecond = 100

// readCPU reads the aggregate cpu line of /proc/stat and the process tree;
// ok is false where there is no /proc/stat.
func readCPU() cpuTimes {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return cpuTimes{}
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 9 || fields[0] != "cpu" {
		return cpuTimes{}
	}
	var t cpuTimes
	// user nice system idle iowait irq softirq steal [guest guest_nice]:
	// guest time is already counted in user.
	for i, f := range fields[1:9] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return cpuTimes{}
		}
		t.total += v
		switch i {
		case 3, 4: // idle, iowait
		case 7:
			t.steal = v
		default:
			t.busy += v
		}
	}
	t.tree = treeTimes(os.Getpid())
	t.ok = true
	return t
}

// treeTimes returns the CPU time (user + system) of root and each of its
// descendants.
func treeTimes(root int) map[int]procCPU {
	type proc struct {
		ppid int
		cpu  procCPU
	}
	procs := map[int]proc{}
	paths, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime stime: comm may hold spaces, so
		// split after its closing parenthesis.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b[:bytes.IndexByte(b, '(')])))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		utime, _ := strconv.ParseUint(f[11], 10, 64)
		stime, _ := strconv.ParseUint(f[12], 10, 64)
		comm := string(b[bytes.IndexByte(b, '(')+1 : i])
		procs[pid] = proc{ppid: ppid, cpu: procCPU{ticks: utime + stime, db: comm == "postgres"}}
	}
	out := map[int]procCPU{}
	for pid, p := range procs {
		for q, hops := pid, 0; q > 0 && hops < 64; q, hops = procs[q].ppid, hops+1 {
			if q == root {
				out[pid] = p.cpu
				break
			}
			if _, ok := procs[q]; !ok {
				break
			}
		}
	}
	return out
}

// window is a measured interval: its start time, CPU times and the
// cluster's counters.
type window struct {
	start time.Time
	cpu   cpuTimes
	db    dbCounters
}

// begin starts a window now.
func begin() window { return window{start: time.Now(), cpu: readCPU(), db: readDBCounters()} }

// walMeter is the pool that reads the cluster's WAL position for the
// windows while a benchmark runs (see openWALMeter).
var walMeter atomic.Pointer[pgxpool.Pool]

// openWALMeter connects to the cluster at dsn for the windows' WAL
// positions and returns the function that disconnects. A cluster it cannot
// reach leaves the positions unknown.
func openWALMeter(ctx context.Context, dsn string) func() {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return func() {}
	}
	walMeter.Store(pool)
	return func() {
		walMeter.CompareAndSwap(pool, nil)
		pool.Close()
	}
}

// dbCounters are the cluster's counters a window reads at its start and
// end: the WAL insert position in bytes, the WAL flushes to disk
// (pg_stat_wal's wal_sync) and the transactions committed in all its
// databases. Each is -1 when unknown. The differences of two are what
// every database of the cluster did between them, full-page images after
// a checkpoint included: the benchmark's runs have the cluster to
// themselves. PostgreSQL publishes the flushes and commits of a backend
// when it goes idle, at most a second late: over a run's window of
// seconds they are close, not exact.
type dbCounters struct {
	wal, syncs, commits int64
}

// unknownCounters is the counters of a cluster not reached.
var unknownCounters = dbCounters{-1, -1, -1}

// readDBCounters reads the cluster's counters.
func readDBCounters() dbCounters {
	pool := walMeter.Load()
	if pool == nil {
		return unknownCounters
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := unknownCounters
	if err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&c.wal); err != nil {
		return unknownCounters
	}
	// pg_stat_wal's wal_sync is there from PostgreSQL 14 on (in 18,
	// pg_stat_io counts the flushes instead); without it, flushes stay
	// unknown.
	var syncs, commits *int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT sum(xact_commit) FROM pg_stat_database)::bigint,
		(SELECT to_jsonb(w) -> 'wal_sync' FROM pg_stat_wal w)::bigint`).Scan(&commits, &syncs); err == nil {
		if commits != nil {
			c.commits = *commits
		}
		if syncs != nil {
			c.syncs = *syncs
		}
	}
	return c
}

// since returns what the counters moved since c0, each -1 where either
// is unknown or it went back (a restarted cluster).
func (c dbCounters) since(c0 dbCounters) (wal, syncs, commits float64) {
	d := func(a, b int64) float64 {
		if a < 0 || b < 0 || a < b {
			return -1
		}
		return float64(a - b)
	}
	return d(c.wal, c0.wal), d(c.syncs, c0.syncs), d(c.commits, c0.commits)
}

// usage is how the machine's CPU time was spent during a window, in percent
// of all of it (all cores): Ours went to this benchmark's process tree (the
// harness, the systems under test, their node processes and PostgreSQL),
// Others to processes outside it (other work on the same machine), Steal to
// other virtual machines. All are -1 when unknown. GoSecs and DBSecs split
// Ours in CPU seconds: the Go processes (this benchmark with the system it
// runs in-process, and node processes) and the PostgreSQL ones.
// WALBytes is the WAL the cluster wrote, WALSyncs the times it flushed
// WAL to disk and Commits the transactions it committed (see dbCounters),
// each -1 when unknown.
type usage struct {
	Ours     float64 `json:"ours_pct"`
	Others   float64 `json:"others_pct"`
	Steal    float64 `json:"steal_pct"`
	GoSecs   float64 `json:"go_cpu_seconds"`
	DBSecs   float64 `json:"db_cpu_seconds"`
	WALBytes float64 `json:"wal_bytes"`
	WALSyncs float64 `json:"wal_syncs"`
	Commits  float64 `json:"commits"`
}

// unknownUsage is the usage where /proc is missing.
var unknownUsage = usage{Ours: -1, Others: -1, Steal: -1, WALBytes: -1, WALSyncs: -1, Commits: -1}

// usage returns the window's CPU usage and the cluster's work so far.
func (w window) usage() usage {
	wal, syncs, commits := readDBCounters().since(w.db)
	now := readCPU()
	if !w.cpu.ok || !now.ok || now.total <= w.cpu.total {
		u := unknownUsage
		u.WALBytes, u.WALSyncs, u.Commits = wal, syncs, commits
		return u
	}
	total := float64(now.total - w.cpu.total)
	var goTicks, dbTicks uint64
	for pid, p := range now.tree {
		d := p.ticks
		if p0, ok := w.cpu.tree[pid]; ok {
			d = max(p.ticks, p0.ticks) - p0.ticks
		}
		if p.db {
			dbTicks += d
		} else {
			goTicks += d
		}
	}
	ours := goTicks + dbTicks
	others := max(float64(now.busy-w.cpu.busy)-float64(ours), 0)
	return usage{Ours: 100 * float64(ours) / total, Others: 100 * others / total, Steal: 100 * float64(now.steal-w.cpu.steal) / total,
		GoSecs: float64(goTicks) / ticksPerSecond, DBSecs: float64(dbTicks) / ticksPerSecond, WALBytes: wal, WALSyncs: syncs, Commits: commits}
}

// noisyPct is the share of the machine's CPU time, in percent, that other
// processes and other virtual machines together may take during a run
// before the run is flagged as noisy: its figures then say as much about
// the machine's other load as about the systems measured.
const noisyPct = 10

// noisy reports whether others and steal took more than noisyPct of the
// CPU time; an unknown usage is not noisy.
func (u usage) noisy() bool { return u.Steal >= 0 && u.Others+u.Steal > noisyPct }
