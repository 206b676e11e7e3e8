package soak

import (
	"context"
	"encoding/csv"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/behaviors/cleanup"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/childtest"
	"github.com/stinthq/stint/internal/pgcluster"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store/postgres"
)

var (
	duration = flag.Duration("soak.duration", 0, "run the soak this long (off when zero)")
	rate     = flag.Float64("soak.rate", 300, "tasks a second the soak submits, workflows and ticks aside")
	every    = flag.Duration("soak.every", 30*time.Second, "time between samples")
	csvPath  = flag.String("soak.csv", "", "write the samples as CSV to this file")
	logDir   = flag.String("soak.logs", "", "keep the node processes' JSON logs in this directory")
)

func TestMain(m *testing.M) {
	if os.Getenv(envDSN) != "" {
		runNode()
		return
	}
	pgtest.Main(m)
}

// lateBound is how long past its retention a finished task may be kept:
// the cleanup's interval, and a minute for its run and its claim.
const lateBound = cleanup.DefaultInterval + time.Minute

func TestSoak(t *testing.T) {
	if *duration <= 0 {
		t.Skip("the soak runs with -soak.duration (e.g. -soak.duration=1h -timeout=2h)")
	}
	if dl, ok := t.Deadline(); ok && time.Until(dl) < *duration+5*time.Minute {
		t.Fatalf("-timeout leaves %s, too little for -soak.duration=%s and the checks after it: give -timeout=%s",
			time.Until(dl).Round(time.Second), *duration, *duration+10*time.Minute)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *duration+5*time.Minute)
	defer cancel()

	// A cluster of its own at PostgreSQL's defaults (durable, unlike the
	// test binaries' fast ones), so that WAL and autovacuum are as in
	// production.
	dir := pgtest.TempDir(t)
	cl, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Stop() })
	admin, err := pgx.Connect(ctx, cl.DSN("postgres"))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `CREATE DATABASE soak`)
	require.NoError(t, err)
	require.NoError(t, admin.Close(ctx))
	dsn := cl.DSN("soak")
	st, err := postgres.Open(ctx, dsn, postgres.Migrate())
	require.NoError(t, err)
	t.Cleanup(st.Close)
	_, err = st.Pool().Exec(ctx, `CREATE UNLOGGED TABLE soak_effect (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		n bigint NOT NULL, kind smallint NOT NULL, attempt int NOT NULL, latency_us bigint)`)
	require.NoError(t, err)
	client, err := impl.NewClient(st, impl.ClientConfig{Registry: registry(nil), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(client.Close)

	logs := t.TempDir()
	if *logDir != "" {
		logs = *logDir
		require.NoError(t, os.MkdirAll(logs, 0o755))
	}
	var nodes []*node
	for i := range 2 {
		name := fmt.Sprint("node-", i)
		stats := filepath.Join(t.TempDir(), "stats")
		c := childtest.Start(t, envDSN+"="+dsn, envNode+"="+name, envLog+"="+filepath.Join(logs, name+".log"), envStats+"="+stats)
		addr, err := os.ReadFile(stats)
		require.NoError(t, err)
		nodes = append(nodes, &node{name: name, pid: c.Cmd.Process.Pid, stats: string(addr)})
		t.Logf("%s: pid %d, profiles at http://%s/debug/pprof/", name, c.Cmd.Process.Pid, addr)
	}

	l := &load{client: client, rate: *rate}
	pid, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	require.NoError(t, err)
	postmaster, err := strconv.Atoi(strings.SplitN(string(pid), "\n", 2)[0])
	require.NoError(t, err)
	smp := &sampler{pool: st.Pool(), load: l, nodes: nodes, bound: lateBound, postmaster: postmaster}
	require.NoError(t, smp.start(ctx))
	loadCtx, stopLoad := context.WithTimeout(ctx, *duration)
	defer stopLoad()
	var wg sync.WaitGroup
	wg.Go(func() { l.run(loadCtx) })
	wg.Go(func() { l.workflows(loadCtx) })

	t.Logf("soak: %s at %.0f tasks/s on two nodes; a sample every %s", *duration, *rate, *every)
	t.Log(header(len(nodes)))
	var out *csvLog
	if *csvPath != "" {
		f, err := os.Create(*csvPath)
		require.NoError(t, err)
		defer f.Close()
		out = &csvLog{w: csv.NewWriter(f)}
	}
	var samples []sample
	tick := time.NewTicker(*every)
	for loadCtx.Err() == nil {
		select {
		case <-loadCtx.Done():
		case <-tick.C:
			s, err := smp.take(ctx)
			require.NoError(t, err)
			samples = append(samples, s)
			t.Log(row(s))
			if out != nil {
				require.NoError(t, out.write(s))
			}
		}
	}
	tick.Stop()
	wg.Wait()

	logFeed(ctx, t, st.Pool())
	r := ledger(ctx, t, st.Pool(), l)
	t.Logf("ledger: %s", r)
	failed := false
	for _, g := range goals(samples, *rate) {
		verdict := "holds"
		if !g.ok {
			verdict, failed = "FAILS", true
		}
		t.Logf("goal %-15s %s: %s", g.name, verdict, g.detail)
	}
	require.Zero(t, r.lost, "lost tasks")
	require.Zero(t, r.duplicated, "duplicated tasks")
	require.Zero(t, r.duplicateTicks, "duplicate ticks")
	require.False(t, failed, "a goal fails; see the lines above")
}

// report is the ledger's verdict.
type report struct {
	acknowledged, done, lost, duplicated, unexpected int
	ticks, duplicateTicks, missedTicks               int
	submitErrors                                     int64
	lastSubmitError                                  string
}

func (r report) String() string {
	s := fmt.Sprintf("acknowledged=%d done=%d lost=%d duplicated=%d unexpected=%d ticks=%d duplicate_ticks=%d missed_ticks=%d submit_errors=%d",
		r.acknowledged, r.done, r.lost, r.duplicated, r.unexpected, r.ticks, r.duplicateTicks, r.missedTicks, r.submitErrors)
	if r.lastSubmitError != "" {
		s += " (last: " + r.lastSubmitError + ")"
	}
	return s
}

// ledger waits for the acknowledged tasks to end, while they make
// progress, and compares their effects with what was acknowledged: a
// task is lost without an effect, duplicated with more than one.
func ledger(ctx context.Context, t *testing.T, pool *pgxpool.Pool, l *load) report {
	open := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stint_task
			WHERE behavior LIKE 'soak.%' AND behavior <> 'soak.tick'
			  AND (status NOT IN ('success', 'failure') OR schedule_not_before IS NOT NULL)`).Scan(&n))
		return n
	}
	left, progressed := open(), time.Now()
	for left > 0 && time.Since(progressed) < time.Minute {
		time.Sleep(time.Second) // polling the database for the tasks to end, bounded by the progress deadline
		if n := open(); n < left {
			left, progressed = n, time.Now()
		}
	}
	acked := l.ackedSet()
	counts := make([]uint8, len(acked))
	r := report{submitErrors: l.errs.Load()}
	if v, ok := l.lastErr.Load().(string); ok {
		r.lastSubmitError = v
	}
	rows, err := pool.Query(ctx, `SELECT n, kind = $1, count(*) FROM soak_effect GROUP BY 1, 2`, kindTick)
	require.NoError(t, err)
	var n int64
	var tick bool
	var c int
	var first, last int64
	_, err = pgx.ForEachRow(rows, []any{&n, &tick, &c}, func() error {
		if tick {
			r.ticks++
			if c > 1 {
				r.duplicateTicks++
			}
			if first == 0 || n < first {
				first = n
			}
			last = max(last, n)
			return nil
		}
		if n >= int64(len(acked)) || !acked[n] {
			r.unexpected++
			return nil
		}
		counts[n] = uint8(min(c, 255))
		return nil
	})
	require.NoError(t, err)
	if r.ticks > 0 {
		r.missedTicks = int(last-first+1) - r.ticks
	}
	for i, a := range acked {
		if !a {
			continue
		}
		r.acknowledged++
		switch {
		case counts[i] == 0:
			r.lost++
		case counts[i] > 1:
			r.duplicated++
			r.done++
		default:
			r.done++
		}
	}
	if r.lost > 0 {
		var missing []string
		for i, a := range acked {
			if a && counts[i] == 0 && len(missing) < 10 {
				missing = append(missing, fmt.Sprint(i))
			}
		}
		t.Logf("lost (the first): %s", strings.Join(missing, ", "))
	}
	return r
}

// logFeed logs what the change feed holds: its rows by the status of
// their first change, with the changes a row carries and its size.
func logFeed(ctx context.Context, t *testing.T, pool *pgxpool.Pool) {
	rows, err := pool.Query(ctx, `SELECT statuses[1], count(*), avg(cardinality(task_ids)), avg(pg_column_size(c.*))
		FROM stint_change c GROUP BY 1 ORDER BY 2 DESC`)
	require.NoError(t, err)
	var status string
	var n int64
	var changes, bytes float64
	_, err = pgx.ForEachRow(rows, []any{&status, &n, &changes, &bytes}, func() error {
		t.Logf("feed: %-10s %8d rows of %5.1f changes, %4.0f bytes", status, n, changes, bytes)
		return nil
	})
	require.NoError(t, err)
}
