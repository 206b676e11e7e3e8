package soak

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sample is what the sampler saw over one interval, and at its end.
type sample struct {
	At      time.Duration // since the load started
	Seconds float64       // the interval's length
	Load1   float64       // the machine's load average over a minute

	Submitted int64 // tasks of the mix acknowledged in the interval
	Done      int64 // effects of the mix's tasks in the interval
	Nodes     int64 // effects of workflow nodes
	Ticks     int64 // effects of schedule ticks
	// Latencies are the delays from submit to the start of the first
	// attempt of the mix's tasks that ended in the interval, in
	// microseconds.
	Latencies []int64

	RSS        []int64   // each node's resident set, bytes
	Heap       []int64   // each node's heap objects, bytes
	Goroutines []int     // each node's goroutines
	CPU        []float64 // each node's CPU time in the interval, seconds
	// PGCPU is PostgreSQL's CPU time in the interval (its processes',
	// those that ended included), seconds.
	PGCPU float64

	Tables  map[string]int64 // every stint table's size with its TOAST, bytes
	Indexes map[string]int64 // every stint index's size, bytes
	Dead    map[string]int64 // every stint table's dead tuples
	Live    map[string]int64 // every stint table's live tuples
	// Vacuums counts autovacuum runs of every stint table so far.
	Vacuums map[string]int64
	// WAL is the WAL written in the interval, bytes.
	WAL int64
	// FeedBytes and FeedRows are the change feed's size (stint_change with
	// its TOAST and indexes).
	FeedBytes, FeedRows int64
	// Finished counts finished-for-good tasks of the load (cleanup's own
	// aside) still stored; Late counts those kept past their retention
	// plus the bound, and MaxLate is the longest any was kept past its
	// retention.
	Finished, Late int64
	MaxLate        time.Duration
}

// throughput is the mix's tasks done a second.
func (s sample) throughput() float64 { return float64(s.Done) / s.Seconds }

// p99 is the 99th percentile of latencies (microseconds), 0 for none.
func p99(latencies []int64) time.Duration {
	if len(latencies) == 0 {
		return 0
	}
	l := slices.Clone(latencies)
	slices.Sort(l)
	return time.Duration(l[(len(l)*99)/100]) * time.Microsecond
}

// sum adds up the values of m.
func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// sampler reads a sample from the database and the node processes.
type sampler struct {
	pool  *pgxpool.Pool
	load  *load
	nodes []*node
	bound time.Duration // how long past its retention a task may be kept
	// postmaster is the PostgreSQL server's process.
	postmaster int

	began      time.Time
	last       time.Time
	lastEffect int64
	lastWAL    string
	lastSub    int64
	lastCPU    []float64
	lastPGCPU  float64
}

// node is a node process of the soak.
type node struct {
	name  string
	pid   int
	stats string // its stats address
}

func (s *sampler) start(ctx context.Context) error {
	s.began, s.last = time.Now(), time.Now()
	s.lastCPU = make([]float64, len(s.nodes))
	for i, n := range s.nodes {
		s.lastCPU[i], _ = cpuSeconds(n.pid)
	}
	s.lastPGCPU = treeCPUSeconds(s.postmaster)
	return s.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s.lastWAL)
}

// take reads one sample.
func (s *sampler) take(ctx context.Context) (sample, error) {
	now := time.Now()
	out := sample{At: now.Sub(s.began), Seconds: now.Sub(s.last).Seconds(), Load1: load1(),
		Tables: map[string]int64{}, Indexes: map[string]int64{}, Dead: map[string]int64{}, Live: map[string]int64{}, Vacuums: map[string]int64{}}
	s.last = now
	sub := s.load.submitted.Load()
	out.Submitted, s.lastSub = sub-s.lastSub, sub

	// The effects since the last sample. A row whose id was drawn before
	// the last read but committed after it is not counted here; the
	// ledger reads them all at the end.
	rows, err := s.pool.Query(ctx, `SELECT id, kind, latency_us FROM soak_effect WHERE id > $1`, s.lastEffect)
	if err != nil {
		return out, fmt.Errorf("read effects: %w", err)
	}
	var id int64
	var kind int
	var latency *int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &kind, &latency}, func() error {
		s.lastEffect = max(s.lastEffect, id)
		switch kind {
		case kindTask, kindGrouped:
			out.Done++
			if latency != nil {
				out.Latencies = append(out.Latencies, *latency)
			}
		case kindNode:
			out.Nodes++
		case kindTick:
			out.Ticks++
		}
		return nil
	}); err != nil {
		return out, fmt.Errorf("read effects: %w", err)
	}

	for i, n := range s.nodes {
		rss, err := rssBytes(n.pid)
		if err != nil {
			return out, err
		}
		g, heap, err := nodeStats(ctx, n.stats)
		if err != nil {
			return out, err
		}
		cpu, err := cpuSeconds(n.pid)
		if err != nil {
			return out, err
		}
		out.RSS = append(out.RSS, rss)
		out.Goroutines = append(out.Goroutines, g)
		out.Heap = append(out.Heap, heap)
		out.CPU = append(out.CPU, cpu-s.lastCPU[i])
		s.lastCPU[i] = cpu
	}

	pg := treeCPUSeconds(s.postmaster)
	out.PGCPU, s.lastPGCPU = pg-s.lastPGCPU, pg

	rows, err = s.pool.Query(ctx, `
		SELECT c.relname, c.relkind = 'i', CASE WHEN c.relkind = 'i' THEN pg_relation_size(c.oid) ELSE pg_table_size(c.oid) END
		FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace
		WHERE ns.nspname = current_schema() AND c.relname LIKE 'stint\_%' AND c.relkind IN ('r', 'i')`)
	if err != nil {
		return out, fmt.Errorf("read sizes: %w", err)
	}
	var name string
	var index bool
	var size int64
	if _, err := pgx.ForEachRow(rows, []any{&name, &index, &size}, func() error {
		if index {
			out.Indexes[name] = size
		} else {
			out.Tables[name] = size
		}
		return nil
	}); err != nil {
		return out, fmt.Errorf("read sizes: %w", err)
	}
	rows, err = s.pool.Query(ctx, `
		SELECT relname, n_live_tup, n_dead_tup, autovacuum_count FROM pg_stat_user_tables
		WHERE schemaname = current_schema() AND relname LIKE 'stint\_%'`)
	if err != nil {
		return out, fmt.Errorf("read table statistics: %w", err)
	}
	var live, dead, vacuums int64
	if _, err := pgx.ForEachRow(rows, []any{&name, &live, &dead, &vacuums}, func() error {
		out.Live[name], out.Dead[name], out.Vacuums[name] = live, dead, vacuums
		return nil
	}); err != nil {
		return out, fmt.Errorf("read table statistics: %w", err)
	}
	var lsn string
	if err := s.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint,
			pg_total_relation_size('stint_change'), (SELECT count(*) FROM stint_change)`, s.lastWAL).
		Scan(&lsn, &out.WAL, &out.FeedBytes, &out.FeedRows); err != nil {
		return out, fmt.Errorf("read the WAL and the feed: %w", err)
	}
	s.lastWAL = lsn
	var late float64
	if err := s.pool.QueryRow(ctx, `
		SELECT count(*), count(*) FILTER (WHERE late > $1 * interval '1 microsecond'),
		    coalesce(extract(epoch FROM max(late)), 0)
		FROM (SELECT now() - finished_at - coalesce(retention_us, 1) * interval '1 microsecond' AS late
		      FROM stint_task WHERE behavior <> 'cleanup' AND status IN ('success', 'failure')
		        AND schedule_not_before IS NULL AND finished_at IS NOT NULL) f`, s.bound.Microseconds()).
		Scan(&out.Finished, &out.Late, &late); err != nil {
		return out, fmt.Errorf("read finished tasks: %w", err)
	}
	out.MaxLate = time.Duration(late * float64(time.Second))
	return out, nil
}

// rssBytes reads a process's resident set.
func rssBytes(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read the RSS of %d: %w", pid, err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for process %d", pid)
}

// procStat reads the fields of /proc/PID/stat after the command's closing
// parenthesis: the state is the first, the parent the second, utime,
// stime, cutime and cstime the 12th to 15th.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, fmt.Errorf("read the CPU time of %d: %w", pid, err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 15 {
		return nil, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return f, nil
}

// ticks adds up the fields of f that count clock ticks of 1/100 s
// (USER_HZ), as seconds.
func ticks(f ...string) float64 {
	var n float64
	for _, v := range f {
		x, _ := strconv.ParseFloat(v, 64)
		n += x
	}
	return n / 100
}

// cpuSeconds reads a process's user and system time.
func cpuSeconds(pid int) (float64, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	return ticks(f[11], f[12]), nil
}

// treeCPUSeconds is the CPU time of process pid, its children's that it
// waited for, and its live children's: a PostgreSQL server's, its
// backends and workers included.
func treeCPUSeconds(pid int) float64 {
	f, err := procStat(pid)
	if err != nil {
		return 0
	}
	total := ticks(f[11], f[12], f[13], f[14])
	entries, _ := os.ReadDir("/proc")
	parent := strconv.Itoa(pid)
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f, err := procStat(child); err == nil && f[1] == parent {
			total += ticks(f[11], f[12])
		}
	}
	return total
}

// nodeStats asks a node for its goroutines and the bytes of its heap's
// objects.
func nodeStats(ctx context.Context, addr string) (int, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("ask %s for its stats: %w", addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, fmt.Errorf("ask %s for its stats: %w", addr, err)
	}
	var g int
	var heap int64
	if _, err := fmt.Sscan(string(b), &g, &heap); err != nil {
		return 0, 0, fmt.Errorf("read the stats of %s (%q): %w", addr, b, err)
	}
	return g, heap, nil
}

// load1 is the machine's load average over the last minute.
func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return v
}
