package chaos

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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

var (
	long     = flag.Bool("chaos.long", false, "run longer workloads and faults")
	keepLogs = flag.String("chaos.logs", "", "keep the node processes' logs under this directory, a subdirectory per test")
)

// Environment of a node process.
const (
	envDSN  = "STINT_CHAOS_DSN"
	envNode = "STINT_CHAOS_NODE"
	envLog  = "STINT_CHAOS_LOG" // a file for the node's log, as JSON lines
	// envListen is the URL of the node's LISTEN connection, if not its
	// pool's (behind PgBouncer).
	envListen = "STINT_CHAOS_LISTEN_DSN"
	// envLease is the lease of the node's behaviors (a Go duration), if
	// not lease.
	envLease = "STINT_CHAOS_LEASE"
)

// lease is the lease of chaos.work and the flow behaviors: short, so that
// takeovers are quick. A node process started with envLease uses that
// instead.
var lease = time.Second

func TestMain(m *testing.M) {
	if os.Getenv(envMigrate) != "" {
		runMigrator()
		return
	}
	if os.Getenv(envSetRate) != "" {
		runRateSetter()
		return
	}
	if os.Getenv(envDSN) != "" {
		runNode()
		return
	}
	pgtest.Main(m)
}

// WorkParams are the params of chaos.work.
type WorkParams struct {
	N       int `json:"n"`
	SleepMS int `json:"sleep_ms" validate:"gte=0,lte=1000"`
}

var workKind = api.Kind[WorkParams, string]{ID: "chaos.work"}

// work is chaos.work. Each run records its start and end in chaos_run
// under a run id of its own, and writes its result row in chaos_result in
// the same transaction as a fenced checkpoint: a run whose lease is gone
// cannot write a result.
type work struct {
	pool  *pgxpool.Pool
	node  string
	lease time.Duration // if not lease
}

func (work) Kind() api.Kind[WorkParams, string]          { return workKind }
func (work) TaskID(ids spi.IDs, p WorkParams) api.TaskID { return ids.Deterministic(p.N) }
func (w work) Policy() spi.Policy {
	return spi.Policy{Lease: cmp.Or(w.lease, lease), MaxAttempts: 1000, BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond}
}

func (w work) Run(ctx context.Context, rc spi.RunContext, p WorkParams) (string, error) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	run := hex.EncodeToString(b)
	if _, err := w.pool.Exec(ctx, `INSERT INTO chaos_run (run_id, task_id, node, started) VALUES ($1, $2, $3, clock_timestamp())`,
		run, string(rc.TaskID()), w.node); err != nil {
		return "", api.Retryable("record", "record start: %v", err)
	}
	select {
	case <-ctx.Done():
		return "", context.Cause(ctx)
	case <-time.After(time.Duration(p.SleepMS) * time.Millisecond):
	}
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO chaos_result (run_id, task_id, at) VALUES ($1, $2, clock_timestamp())`, run, string(rc.TaskID())); err != nil {
			return err
		}
		return rc.CheckpointTx(ctx, tx, run)
	})
	if err != nil {
		return "", api.Retryable("result", "write result: %v", err)
	}
	if _, err := w.pool.Exec(ctx, `UPDATE chaos_run SET ended = clock_timestamp() WHERE run_id = $1`, run); err != nil {
		return "", api.Retryable("record", "record end: %v", err)
	}
	return run, nil
}

func registry(pool *pgxpool.Pool, node string) *spi.Registry {
	reg := spi.NewRegistry()
	spi.MustRegister[WorkParams, string](reg, work{pool: pool, node: node})
	spi.MustRegister[FlowParams, struct{}](reg, limited{pool: pool, node: node})
	spi.MustRegister[FlowParams, struct{}](reg, loose{limited{pool: pool, node: node}})
	spi.MustRegister[WorkParams, string](reg, locked{pool: pool})
	spi.MustRegister[WorkParams, string](reg, wfNode{work{pool: pool, node: node}})
	return reg
}

// runNode is a server process: it runs until SIGTERM or SIGKILL.
func runNode() {
	if v := os.Getenv(envLease); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		lease = d
	}
	if point := os.Getenv(envFreezeAt); point != "" {
		freezeOnSignal(point)
	}
	var opts []postgres.Option
	if dsn := os.Getenv(envListen); dsn != "" {
		opts = append(opts, postgres.ListenDSN(dsn))
	}
	childtest.Serve(os.Getenv(envDSN), func(st *postgres.Store) (*impl.Server, error) {
		node := os.Getenv(envNode)
		var out io.Writer = io.Discard
		if path := os.Getenv(envLog); path != "" {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
			if err != nil {
				return nil, err
			}
			out = f // open until the process ends
		}
		return impl.NewServer(st, impl.ServerConfig{Node: node, Registry: registry(st.Pool(), node), MaxWorkers: 50,
			PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.NewJSONHandler(out, nil))})
	}, opts...)
}

// cluster is one scenario: a database, three node processes and a client.
type cluster struct {
	t      *testing.T
	ctx    context.Context
	dsn    string
	pool   *pgxpool.Pool
	client *impl.Client
	nodes  []*node
	kills  []kill
	// extra are tasks a fault acknowledged, checked with the workload's.
	extra []api.TaskID
}

type node struct {
	name   string
	dsn    string
	listen string        // the URL of its LISTEN connection, if not dsn
	log    string        // the node's log file, JSON lines (see nodeLog)
	lease  time.Duration // its behaviors' lease, if not lease
	cmd    *exec.Cmd
	child  *childtest.Child
	// freezeAt, if set, is the fault point (see internal/faultpoint) at
	// which the node process stops itself once armed (see freeze).
	freezeAt string
}

type kill struct {
	node string
	at   time.Time // database clock
}

func newCluster(t *testing.T) *cluster { return newClusterAt(t, pgtest.New(t)) }

// newClusterAt is newCluster on the database at dsn.
func newClusterAt(t *testing.T, dsn string) *cluster {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	st, err := postgres.Open(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	_, err = st.Pool().Exec(ctx, `
		CREATE TABLE chaos_run (run_id text PRIMARY KEY, task_id text NOT NULL, node text NOT NULL, started timestamptz NOT NULL, ended timestamptz);
		CREATE TABLE chaos_result (run_id text PRIMARY KEY, task_id text NOT NULL, at timestamptz NOT NULL)`)
	require.NoError(t, err)
	client, err := impl.NewClient(st, impl.ClientConfig{Registry: registry(st.Pool(), "client"), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	c := &cluster{t: t, ctx: ctx, dsn: dsn, pool: st.Pool(), client: client}
	logs := t.TempDir()
	if *keepLogs != "" {
		logs = filepath.Join(*keepLogs, strings.ReplaceAll(t.Name(), "/", "_"))
		require.NoError(t, os.MkdirAll(logs, 0o755))
	}
	for i := range 3 {
		name := fmt.Sprint("node-", i)
		c.nodes = append(c.nodes, &node{name: name, dsn: dsn, log: filepath.Join(logs, name+".log")})
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if n.cmd != nil {
				_ = n.cmd.Process.Kill()
				_ = n.cmd.Wait()
			}
		}
	})
	return c
}

// start starts a node process and waits until it is ready.
func (c *cluster) start(n *node) {
	env := []string{envDSN + "=" + n.dsn, envNode + "=" + n.name, envLog + "=" + n.log, envListen + "=" + n.listen}
	if n.lease > 0 {
		env = append(env, envLease+"="+n.lease.String())
	}
	if n.freezeAt != "" {
		env = append(env, envFreezeAt+"="+n.freezeAt)
	}
	n.child = childtest.Start(c.t, env...)
	n.cmd = n.child.Cmd
}

func (c *cluster) startAll() {
	for _, n := range c.nodes {
		c.start(n)
	}
}

// sigkill kills a node and records when, by the database clock.
func (c *cluster) sigkill(n *node) {
	var at time.Time
	require.NoError(c.t, c.pool.QueryRow(c.ctx, `SELECT clock_timestamp()`).Scan(&at))
	require.NoError(c.t, n.cmd.Process.Kill())
	_ = n.cmd.Wait()
	n.cmd = nil
	c.kills = append(c.kills, kill{node: n.name, at: at})
}

// submit submits tasks 0..count-1 in batches, retrying each batch until
// it is acknowledged (a fault may fail a submit; it must then have stored
// all of the batch or none). It returns the acknowledged ids.
func (c *cluster) submit(count int) []api.TaskID { return c.submitFrom(0, count) }

// submitFrom is submit of tasks first..first+count-1.
func (c *cluster) submitFrom(first, count int) []api.TaskID {
	var ids []api.TaskID
	for start := first; start < first+count; start += 100 {
		reqs := make([]api.SubmitRequest, 0, 100)
		for n := start; n < min(start+100, first+count); n++ {
			reqs = append(reqs, api.SubmitRequest{Behavior: workKind.ID, Params: fmt.Appendf(nil, `{"n":%d,"sleep_ms":%d}`, n, mrand.IntN(150))})
		}
		for {
			subs, err := c.client.SubmitMany(c.ctx, reqs)
			if err == nil {
				for _, s := range subs {
					ids = append(ids, s.ID)
				}
				break
			}
			require.NoError(c.t, c.ctx.Err(), "gave up submitting: %v", err)
			time.Sleep(50 * time.Millisecond) // backoff between retries of a failed submit
		}
	}
	return ids
}

// report is the checker's verdict.
type report struct {
	tasks, ok, lost, duplicated, recovered, unexpected int
	recoveryMax, recoveryMean                          time.Duration
	// slowestTakeover tells the story of the task whose takeover took
	// recoveryMax.
	slowestTakeover string
	// slowestQuery is the longest a trivial query took while the fault
	// ran: how slow the machine was for the nodes and the database.
	slowestQuery time.Duration
}

func (r report) String() string {
	return fmt.Sprintf("tasks=%d ok=%d lost=%d duplicated=%d recovered=%d unexpected=%d recovery(max=%s mean=%s)",
		r.tasks, r.ok, r.lost, r.duplicated, r.recovered, r.unexpected, r.recoveryMax.Round(time.Millisecond), r.recoveryMean.Round(time.Millisecond))
}

// check waits for every acknowledged task to finish and classifies them.
// It waits while the tasks make progress: a task is lost when a minute
// (many leases) passes with no task finishing and it is still not done,
// so that a loaded machine, which only slows the work, does not count as
// losing it.
func (c *cluster) check(ids []api.TaskID) report {
	want := make([]string, len(ids))
	for i, id := range ids {
		want[i] = string(id)
	}
	count := func(q string, args ...any) int {
		var n int
		require.NoError(c.t, c.pool.QueryRow(c.ctx, q, args...).Scan(&n))
		return n
	}
	done, progressed := 0, time.Now()
	for done < len(want) && time.Since(progressed) < time.Minute {
		time.Sleep(100 * time.Millisecond) // polling the database for quiescence, bounded by the progress deadline
		if n := count(`SELECT count(*) FROM stint_task WHERE id = ANY($1) AND status = 'success'`, want); n > done {
			done, progressed = n, time.Now()
		}
	}
	r := report{tasks: len(ids)}
	r.ok = count(`SELECT count(*) FROM stint_task WHERE id = ANY($1) AND status = 'success'`, want)
	r.lost = r.tasks - r.ok
	// Two results for one task where the second run started before the
	// first result was written: two lease holders both wrote.
	r.duplicated = count(`SELECT count(DISTINCT r1.task_id) FROM chaos_result r1
		JOIN chaos_result r2 ON r2.task_id = r1.task_id AND r2.run_id <> r1.run_id
		JOIN chaos_run run2 ON run2.run_id = r2.run_id
		WHERE run2.started < r1.at AND r1.at <= r2.at`)
	r.recovered = count(`SELECT count(*) FROM (SELECT task_id FROM chaos_run GROUP BY task_id HAVING count(*) > 1) x`)
	r.unexpected = count(`SELECT count(*) FROM chaos_result WHERE NOT (task_id = ANY($1))`, want)
	var total time.Duration
	var n int
	var slowest struct {
		task string
		kill kill
	}
	for i, k := range c.kills {
		// The runs the kill cut: the node's runs since its process
		// started (after its previous kill) that never ended and were
		// still their task's latest run when it died; a run its node had
		// cut off before (its lease lapsed) and whose task ran again is
		// not the kill's.
		var since time.Time
		for _, p := range c.kills[:i] {
			if p.node == k.node {
				since = p.at
			}
		}
		rows, err := c.pool.Query(c.ctx, `
			SELECT cut.task_id, min(next.started) - $2 FROM chaos_run cut
			JOIN chaos_run next ON next.task_id = cut.task_id AND next.started > $2
			WHERE cut.node = $1 AND cut.started > $3 AND cut.started < $2 AND cut.ended IS NULL
			AND NOT EXISTS (SELECT 1 FROM chaos_run o WHERE o.task_id = cut.task_id AND o.started > cut.started AND o.started <= $2)
			GROUP BY cut.run_id, cut.task_id`, k.node, k.at, since)
		require.NoError(c.t, err)
		type takeover struct {
			Task string
			D    time.Duration
		}
		ds, err := pgx.CollectRows(rows, pgx.RowToStructByPos[takeover])
		require.NoError(c.t, err)
		for _, d := range ds {
			if d.D > r.recoveryMax {
				r.recoveryMax = d.D
				slowest.task, slowest.kill = d.Task, k
			}
			total += d.D
			n++
		}
	}
	if slowest.task != "" {
		// What the slowest takeover's task went through, for a failure's
		// reader: its runs and its changes of status.
		rows, err := c.pool.Query(c.ctx, `
			SELECT format('run %s on %s %s-%s', run_id, node, to_char(started, 'HH24:MI:SS.MS'), coalesce(to_char(ended, 'HH24:MI:SS.MS'), '')), started
			FROM chaos_run WHERE task_id = $1
			UNION ALL
			SELECT format('%s at %s', statuses[i], to_char(at, 'HH24:MI:SS.MS')), at
			FROM stint_change, generate_subscripts(task_ids, 1) i WHERE task_ids[i] = $1
			ORDER BY 2`, slowest.task)
		require.NoError(c.t, err)
		steps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
			var s string
			var at time.Time
			return s, row.Scan(&s, &at)
		})
		require.NoError(c.t, err)
		r.slowestTakeover = fmt.Sprintf("%s killed at %s; task %s: %s", slowest.kill.node, slowest.kill.at.Format("15:04:05.000"),
			slowest.task, strings.Join(steps, ", "))
	}
	if n > 0 {
		r.recoveryMean = total / time.Duration(n)
	}
	return r
}

// scenario runs the workload with a fault going on until the workload is
// submitted and faultFor has passed, then checks.
func scenario(t *testing.T, tasks int, faultFor time.Duration, fault func(c *cluster, stop <-chan struct{})) report {
	c := newCluster(t)
	c.startAll()
	return c.scenario(tasks, faultFor, fault)
}

// scenario is the package's scenario on c, whose nodes run.
func (c *cluster) scenario(tasks int, faultFor time.Duration, fault func(c *cluster, stop <-chan struct{})) report {
	t := c.t
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { fault(c, stop) })
	var slowest time.Duration
	wg.Go(func() { slowest = c.slowestQuery(stop) })
	ids := c.submit(tasks)
	time.Sleep(faultFor) // let the fault run over the workload: the duration is the test's parameter
	close(stop)
	wg.Wait()
	ids = append(ids, c.extra...)
	for _, n := range c.nodes {
		if n.cmd == nil {
			c.start(n)
		}
	}
	r := c.check(ids)
	r.slowestQuery = slowest
	t.Logf("%s: %s; slowest trivial query during the fault %s", t.Name(), r, slowest.Round(time.Millisecond))
	require.Zero(t, r.lost, "lost tasks")
	require.Zero(t, r.duplicated, "duplicated tasks")
	require.Zero(t, r.unexpected, "unexpected results")
	return r
}

func size() (tasks int, faultFor time.Duration) {
	if *long {
		return 20000, time.Minute
	}
	return 2000, 5 * time.Second
}

// slowestQuery runs a trivial query every 50 ms until stop and returns the
// longest one took.
func (c *cluster) slowestQuery(stop <-chan struct{}) time.Duration {
	var slowest time.Duration
	every(stop, 0, 50*time.Millisecond, func() {
		start := time.Now()
		if _, err := c.pool.Exec(c.ctx, `SELECT 1`); err == nil {
			slowest = max(slowest, time.Since(start))
		}
	})
	return slowest
}

// every calls fn after first, then every d, until stop.
func every(stop <-chan struct{}, first, d time.Duration, fn func()) {
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			fn()
			t.Reset(d)
		}
	}
}

func TestSIGKILL(t *testing.T) {
	tasks, faultFor := size()
	r := scenario(t, tasks, faultFor, func(c *cluster, stop <-chan struct{}) {
		every(stop, 700*time.Millisecond, 700*time.Millisecond, func() {
			n := c.nodes[mrand.IntN(len(c.nodes))]
			if n.cmd != nil {
				c.sigkill(n)
				c.start(n)
			}
		})
	})
	require.Positive(t, r.recovered, "the kills should have hit running tasks")
	// About a lease after the kill, with room for the statements between
	// the lease's expiry and the next run (takeover, claim, the run's own
	// writes) on a machine as slow as this run saw it.
	require.Less(t, r.recoveryMax, 10*lease+20*r.slowestQuery, "takeover should come about a lease after the kill; the slowest: %s", r.slowestTakeover)
}

func TestSIGSTOPPastTheLease(t *testing.T) {
	tasks, faultFor := size()
	r := scenario(t, tasks, faultFor, func(c *cluster, stop <-chan struct{}) {
		n := c.nodes[0]
		// The first freeze comes while the workload runs (it takes about a
		// second in the short mode).
		every(stop, 300*time.Millisecond, 3*time.Second, func() {
			require.NoError(t, n.cmd.Process.Signal(syscall.SIGSTOP))
			time.Sleep(2500 * time.Millisecond) // the fault: frozen for longer than the lease
			require.NoError(t, n.cmd.Process.Signal(syscall.SIGCONT))
		})
	})
	require.Positive(t, r.recovered, "the frozen node's tasks should have been taken over")
}

func TestPostgresRestart(t *testing.T) {
	cl := pgtest.Cluster()
	if cl == nil {
		t.Skip("the cluster is not this test binary's (STINT_TEST_DATABASE_URL is set)")
	}
	tasks, faultFor := size()
	scenario(t, tasks, faultFor, func(c *cluster, stop <-chan struct{}) {
		select {
		case <-stop:
			return
		case <-time.After(time.Second):
		}
		require.NoError(t, cl.Restart(c.ctx))
	})
}

func TestProxyCutsAndDelays(t *testing.T) {
	tasks, faultFor := size()
	scenario(t, tasks, faultFor, func(c *cluster, stop <-chan struct{}) {
		u, err := url.Parse(c.dsn)
		require.NoError(t, err)
		p, err := newProxy(u.Host)
		require.NoError(t, err)
		defer p.close()
		// Move node 0 behind the proxy.
		n := c.nodes[0]
		c.sigkill(n)
		u.Host = p.addr()
		n.dsn = u.String()
		c.start(n)
		every(stop, 400*time.Millisecond, 400*time.Millisecond, func() {
			switch mrand.IntN(3) {
			case 0:
				p.cut()
			case 1:
				p.delay.Store(int64(30 * time.Millisecond))
			default:
				p.delay.Store(0)
			}
		})
		p.delay.Store(0)
	})
}

func TestTerminatedBackends(t *testing.T) {
	tasks, faultFor := size()
	scenario(t, tasks, faultFor, func(c *cluster, stop <-chan struct{}) {
		every(stop, 300*time.Millisecond, 300*time.Millisecond, func() {
			_, err := c.pool.Exec(c.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
				ORDER BY random() LIMIT 3`)
			if err != nil && !errors.Is(err, context.Canceled) && !strings.Contains(err.Error(), "terminat") {
				t.Logf("terminate backends: %v", err)
			}
		})
	})
}

func TestXminPinnedByALongTransaction(t *testing.T) {
	tasks, faultFor := size()
	if !*long {
		faultFor = 15 * time.Second
	}
	scenario(t, tasks, faultFor, func(c *cluster, stop <-chan struct{}) {
		conn, err := pgx.Connect(c.ctx, c.dsn)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		tx, err := conn.Begin(c.ctx)
		require.NoError(t, err)
		var xid int64
		require.NoError(t, tx.QueryRow(c.ctx, `SELECT txid_current()`).Scan(&xid))
		<-stop
		require.NoError(t, tx.Rollback(c.ctx))
	})
}
