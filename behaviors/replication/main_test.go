package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/childtest"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// Environment of a child node process (see runChildNode).
const (
	envChildDSN = "STINT_TEST_REPL_CHILD_DSN"
	// envChildBlockAt makes the child block inside the transaction of its
	// batch number N, after writing the rows and before committing, and
	// print "mid-batch".
	envChildBlockAt = "STINT_TEST_REPL_CHILD_BLOCK_AT"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChildDSN) != "" {
		runChildNode()
		return
	}
	pgtest.Main(m)
}

// testConfig is the replication configuration of the tests: short
// intervals, and a lease long enough that a loaded machine does not lose
// it. A node renews a lease once a third of it passed and must be
// answered before it runs out: a 1-second lease left two thirds of a
// second, which a busy machine's renewals exceeded, and the run was
// cancelled and its task taken over (an extra attempt, and a replication
// that starts over its set-up). Tests that want a quick takeover set a
// shorter lease on the node they kill.
func testConfig(db *pgxpool.Pool) Config {
	return Config{
		DB:                 db,
		BatchSize:          500,
		CheckpointInterval: 100 * time.Millisecond,
		PollInterval:       20 * time.Millisecond,
		MinBackoff:         200 * time.Millisecond,
		MaxBackoff:         1600 * time.Millisecond,
		HealthThreshold:    time.Second,
		Lease:              20 * time.Second,
		ConnectTimeout:     2 * time.Second,
	}
}

// runChildNode runs a server node with the replication behaviors until it
// is killed, for tests that SIGKILL a real process. It prints "ready" once
// started.
func runChildNode() {
	childtest.Serve(os.Getenv(envChildDSN), func(st *postgres.Store) (*impl.Server, error) {
		cfg := testConfig(st.Pool())
		// The survivor takes the task over once this lease ran out
		// after the kill. Five seconds leave a renewal more than three
		// of them before it runs out: a loaded machine does not lose it
		// before the kill (a takeover of its own, an extra attempt).
		cfg.Lease = 5 * time.Second
		blockAt, _ := strconv.Atoi(os.Getenv(envChildBlockAt))
		var once sync.Once
		cfg.hook = func(ctx context.Context, event string, _ api.TaskID, n int64) {
			if event == "batch-written" && n == int64(blockAt) {
				once.Do(func() { fmt.Println("mid-batch") })
				select {} // stay inside the transaction until killed
			}
		}
		reg := spi.NewRegistry()
		if err := Register(reg, cfg); err != nil {
			return nil, err
		}
		return impl.NewServer(st, impl.ServerConfig{Node: "doomed", Registry: reg, PollInterval: 50 * time.Millisecond})
	})
}

// env is one test's databases: stint's, a source and a target.
type env struct {
	t        *testing.T
	ctx      context.Context
	dsn      string // the stint database
	st       *postgres.Store
	srcDSN   string
	dstDSN   string
	src, dst *pgxpool.Pool
}

func setup(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx, dsn: pgtest.New(t), srcDSN: pgtest.New(t), dstDSN: pgtest.New(t)}
	var err error
	e.st, err = postgres.Open(ctx, e.dsn)
	require.NoError(t, err)
	t.Cleanup(e.st.Close)
	e.src = e.pool(e.srcDSN)
	e.dst = e.pool(e.dstDSN)
	return e
}

func (e *env) pool(dsn string) *pgxpool.Pool {
	e.t.Helper()
	p, err := pgxpool.New(e.ctx, dsn)
	require.NoError(e.t, err)
	e.t.Cleanup(p.Close)
	return p
}

// logger logs warnings and errors to the test's output.
func (e *env) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// server starts an in-process server running the replication behaviors
// with cfg.
func (e *env) server(node string, cfg Config) *impl.Server {
	e.t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = e.logger()
	}
	reg := spi.NewRegistry()
	require.NoError(e.t, Register(reg, cfg))
	srv, err := impl.NewServer(e.st, impl.ServerConfig{Node: node, Registry: reg, PollInterval: 20 * time.Millisecond,
		AwaitPollInterval: 50 * time.Millisecond, Logger: e.logger()})
	require.NoError(e.t, err)
	require.NoError(e.t, srv.Start(e.ctx))
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	return srv
}

// itemsDDL is the replicated table. The target has the same columns; its
// chg is a plain column.
const itemsDDL = `CREATE TABLE %s (
	id      bigint PRIMARY KEY,
	region  text NOT NULL,
	name    text,
	qty     integer,
	price   numeric(10,2),
	tags    text[],
	data    jsonb,
	at      timestamptz,
	deleted boolean NOT NULL DEFAULT false,
	chg     bigint)`

// makeTables creates table in the source (with the change trigger and n
// rows) and, empty, in the target as each of targets (table if none).
func (e *env) makeTables(table string, n int, targets ...string) {
	e.t.Helper()
	ident := pgx.Identifier{table}.Sanitize()
	_, err := e.src.Exec(e.ctx, fmt.Sprintf(itemsDDL, ident))
	require.NoError(e.t, err)
	if len(targets) == 0 {
		targets = []string{table}
	}
	for _, tt := range targets {
		_, err = e.dst.Exec(e.ctx, fmt.Sprintf(itemsDDL, pgx.Identifier{tt}.Sanitize()))
		require.NoError(e.t, err)
	}
	_, err = InstallChangeTrigger(e.ctx, e.src, table, "chg")
	require.NoError(e.t, err)
	if n > 0 {
		_, err = e.src.Exec(e.ctx, `INSERT INTO `+ident+` (id, region, name, qty, price, tags, data, at)
			SELECT g, (ARRAY['eu','us','ap'])[g % 3 + 1], 'item ' || g, g % 100, (g % 1000) / 10.0,
			       ARRAY['t' || g % 5], jsonb_build_object('n', g), '2026-01-01'::timestamptz + g * interval '1 second'
			FROM generate_series(1, $1) g`, n)
		require.NoError(e.t, err)
	}
}

// params returns the params of a replication of table from the source to
// the target.
func (e *env) params(table string) Params {
	return Params{
		Source:          Endpoint{DSN: e.srcDSN, Table: table},
		Target:          Endpoint{DSN: e.dstDSN, Table: table},
		ChangeColumn:    "chg",
		TombstoneColumn: "deleted",
	}
}

// digest returns the row count and a digest of the live rows of table
// (matching where, if not empty).
func digest(ctx context.Context, t *testing.T, p *pgxpool.Pool, table, where string) (int, string) {
	t.Helper()
	q := `SELECT count(*), coalesce(md5(string_agg(r::text, '|' ORDER BY id)), '') FROM (
		SELECT id, region, name, qty, price, tags, data, at, chg FROM ` + pgx.Identifier{table}.Sanitize() + ` WHERE NOT deleted`
	if where != "" {
		q += " AND " + where
	}
	q += `) r`
	var n int
	var d string
	require.NoError(t, p.QueryRow(ctx, q).Scan(&n, &d))
	return n, d
}

// equal reports whether the target's table dstTable holds exactly the
// live rows of the source's srcTable (matching where).
func (e *env) equal(srcTable, where, dstTable string) bool {
	e.t.Helper()
	n1, d1 := digest(e.ctx, e.t, e.src, srcTable, where)
	n2, d2 := digest(e.ctx, e.t, e.dst, dstTable, "")
	return n1 == n2 && d1 == d2
}

// caughtUp reports whether the target's dstTable holds exactly the live
// rows of the source's srcTable (matching where), once the last checkpoint
// of the replication task id reached the source's head. The digests read
// whole tables, which on a loaded machine takes long enough to slow the
// replication a wait polls for; the checkpoint and the head are read
// through indexes, so the digests are only compared once the replication
// says it caught up.
func (e *env) caughtUp(tasks api.Tasks, id api.TaskID, srcTable, where, dstTable string) bool {
	e.t.Helper()
	var head int64
	require.NoError(e.t, e.src.QueryRow(e.ctx, `SELECT coalesce(max(chg), 0) FROM `+pgx.Identifier{srcTable}.Sanitize()).Scan(&head))
	if _, p := progress(e.t, e.ctx, tasks, id); p.Seq < head {
		return false
	}
	return e.equal(srcTable, where, dstTable)
}

// requireEqual fails unless the target's dstTable holds exactly the live
// rows of the source's srcTable (matching where).
func (e *env) requireEqual(srcTable, where, dstTable string) {
	e.t.Helper()
	n1, d1 := digest(e.ctx, e.t, e.src, srcTable, where)
	n2, d2 := digest(e.ctx, e.t, e.dst, dstTable, "")
	require.Equal(e.t, n1, n2, "row counts of source (live rows) and target")
	require.Equal(e.t, d1, d2, "digests of source (live rows) and target")
}

// writer changes the source table in small transactions until stopped:
// inserts of new rows, updates, tombstones and revivals.
type writer struct {
	inserts, updates, deletes atomic.Int64
	stop                      chan struct{}
	stopOnce                  sync.Once
	done                      chan struct{}
	err                       error
}

// signal asks the writer to stop.
func (w *writer) signal() { w.stopOnce.Do(func() { close(w.stop) }) }

// startWriter starts a writer on table whose new ids start above first;
// pause is the time between transactions.
func (e *env) startWriter(table string, first int64, pause time.Duration) *writer {
	return e.startWriters(table, first, 1, pause)
}

// startWriters starts n concurrent writers on table. Writer i inserts new
// ids above first+i*1,000,000 and updates random rows, holding each
// transaction open for up to a millisecond after its first write, so that
// transactions commit out of the order of their change values. Rows are
// locked in id order, so writers never deadlock.
func (e *env) startWriters(table string, first int64, n int, pause time.Duration) *writer {
	w := &writer{stop: make(chan struct{}), done: make(chan struct{})}
	ident := pgx.Identifier{table}.Sanitize()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range n {
		wg.Go(func() {
			if err := e.write(w, ident, first, first+int64(i)*1_000_000, n > 1, pause); err != nil {
				mu.Lock()
				w.err = errors.Join(w.err, err)
				mu.Unlock()
			}
		})
	}
	go func() { wg.Wait(); close(w.done) }()
	return w
}

// write is one writer's loop; see startWriters. Rows 1 to existing are
// updated; new rows get the ids after next.
func (e *env) write(w *writer, ident string, existing, next int64, dawdle bool, pause time.Duration) error {
	rng := rand.New(rand.NewPCG(uint64(next), 7))
	for {
		select {
		case <-w.stop:
			return nil
		default:
		}
		err := pgx.BeginFunc(e.ctx, e.src, func(tx pgx.Tx) error {
			var updates []int64
			for range 1 + rng.IntN(5) {
				if rng.IntN(10) < 4 {
					next++
					if _, err := tx.Exec(e.ctx, `INSERT INTO `+ident+` (id, region, name, qty, data)
						VALUES ($1, 'eu', $2, 1, '{"new":true}')`, next, fmt.Sprint("new ", next)); err != nil {
						return err
					}
					w.inserts.Add(1)
					continue
				}
				updates = append(updates, 1+rng.Int64N(existing))
			}
			slices.Sort(updates)
			for i, id := range updates {
				if i > 0 && updates[i-1] == id {
					continue
				}
				if rng.IntN(5) == 0 {
					if _, err := tx.Exec(e.ctx, `UPDATE `+ident+` SET deleted = true WHERE id = $1`, id); err != nil {
						return err
					}
					w.deletes.Add(1)
				} else {
					if _, err := tx.Exec(e.ctx, `UPDATE `+ident+` SET qty = coalesce(qty, 0) + 1, deleted = false WHERE id = $1`, id); err != nil {
						return err
					}
					w.updates.Add(1)
				}
				if dawdle {
					time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if pause > 0 {
			time.Sleep(pause)
		}
	}
}

// halt stops the writer and fails the test if it failed.
func (w *writer) halt(t *testing.T) {
	t.Helper()
	w.signal()
	<-w.done
	require.NoError(t, w.err)
}

func (w *writer) String() string {
	return fmt.Sprintf("%d inserts, %d updates, %d tombstones", w.inserts.Load(), w.updates.Load(), w.deletes.Load())
}

// waitFor polls cond every 10 ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// watch polls the progress of task every 10 ms until stop is closed, and
// checks that its checkpoints only move forward: the last sequence and the
// checkpoint count never decrease. It returns how many distinct
// checkpoints it saw.
func watch(t *testing.T, ctx context.Context, tasks api.Tasks, id api.TaskID, stop <-chan struct{}) <-chan int {
	seen := make(chan int, 1)
	go func() {
		var last Progress
		distinct := 0
		defer func() { seen <- distinct }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			task, err := tasks.Get(ctx, id)
			if err != nil {
				t.Errorf("watch %s: %v", id, err)
				return
			}
			p, err := decodeProgress(task.Progress)
			if err != nil {
				t.Errorf("watch %s: %v", id, err)
				return
			}
			if p.Seq < last.Seq || p.Checkpoints < last.Checkpoints {
				t.Errorf("checkpoint went back: seq %d -> %d, checkpoints %d -> %d", last.Seq, p.Seq, last.Checkpoints, p.Checkpoints)
			}
			if p.Checkpoints != last.Checkpoints {
				distinct++
			}
			last = p
		}
	}()
	return seen
}

// progress returns a task's progress.
func progress(t *testing.T, ctx context.Context, tasks api.Tasks, id api.TaskID) (api.Task, Progress) {
	t.Helper()
	task, err := tasks.Get(ctx, id)
	require.NoError(t, err)
	p, err := decodeProgress(task.Progress)
	require.NoError(t, err)
	return task, p
}

// submit submits a transient replication.
func submit(t *testing.T, ctx context.Context, tasks api.Tasks, p Params, continuous bool) *api.Future[Result] {
	t.Helper()
	f, err := api.Submit(ctx, tasks, KindFor(continuous), p)
	require.NoError(t, err)
	require.Equal(t, TaskID(p, continuous), f.ID())
	return f
}
