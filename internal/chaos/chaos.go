package chaos

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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

// Flags of the fault suite, shared by its packages.
var (
	// Long runs longer workloads and faults (-chaos.long; off by default).
	Long     = flag.Bool("chaos.long", false, "run longer workloads and faults")
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
	// not Lease.
	envLease = "STINT_CHAOS_LEASE"
	// envHandOver, when set, turns on the node's hand-over
	// (impl.ServerConfig.HandOver).
	envHandOver = "STINT_CHAOS_HAND_OVER"
)

// Lease is the lease of chaos.work and the flow behaviors: short, so that
// takeovers are quick. A node process started with a lease of its own
// (Node.Lease) uses that instead.
var Lease = time.Second

// Register adds a test package's own behaviors to a registry of its node
// processes and clients; pool is the store's pool and node the process's
// name ("client" for a cluster's client).
type Register func(reg *spi.Registry, pool *pgxpool.Pool, node string)

// registers are the Register functions Main was given.
var registers []Register

// Main is the TestMain of a package of the fault suite: in a node process
// (a child that Cluster.Start runs) it serves until killed; otherwise it
// runs the tests against the test binary's own PostgreSQL cluster (see
// pgtest.Main). Each of extra adds behaviors to every registry, the nodes'
// and the clients'.
func Main(m *testing.M, extra ...Register) {
	registers = extra
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

// AllEdges is a table of every edge of the workflows (task_id runs after
// depends_on): the edge rows and the single dependencies nodes keep in
// their own row, for the scenarios' checks of run order.
const AllEdges = `(SELECT task_id, depends_on FROM stint_dependency
    UNION ALL SELECT id, depends_on FROM stint_task WHERE depends_on IS NOT NULL)`

// WorkKind is chaos.work (see Work).
var WorkKind = api.Kind[WorkParams, string]{ID: "chaos.work"}

// Work is chaos.work. Each run records its start and end in chaos_run
// under a run id of its own, and writes its result row in chaos_result in
// the same transaction as a fenced checkpoint: a run whose lease is gone
// cannot write a result. It retries up to 1,000 times, 10 to 200 ms
// apart.
type Work struct {
	// Pool is where the runs record themselves; Node names the process in
	// the record.
	Pool *pgxpool.Pool
	Node string
	// Lease is the behavior's lease; zero means Lease.
	Lease time.Duration
}

// Kind returns WorkKind.

func (Work) Kind() api.Kind[WorkParams, string] { return WorkKind }

// TaskID derives the task's id from p.N.
func (Work) TaskID(ids spi.IDs, p WorkParams) api.TaskID { return ids.Deterministic(p.N) }

// Policy is a lease of w.Lease and quick retries.
func (w Work) Policy() spi.Policy {
	return spi.Policy{Lease: cmp.Or(w.Lease, Lease), MaxAttempts: 1000, BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond}
}

// Run records the run, sleeps p.SleepMS and writes the result.
func (w Work) Run(ctx context.Context, rc spi.RunContext, p WorkParams) (string, error) {
	run, err := RecordRun(ctx, w.Pool, rc, w.Node)
	if err != nil {
		return "", err
	}
	select {
	case <-ctx.Done():
		return "", context.Cause(ctx)
	case <-time.After(time.Duration(p.SleepMS) * time.Millisecond):
	}
	err = pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO chaos_result (run_id, task_id, at) VALUES ($1, $2, clock_timestamp())`, run, string(rc.TaskID())); err != nil {
			return err
		}
		return rc.CheckpointTx(ctx, tx, run)
	})
	if err != nil {
		return "", api.Retryable("result", "write result: %v", err)
	}
	if _, err := w.Pool.Exec(ctx, `UPDATE chaos_run SET ended = clock_timestamp() WHERE run_id = $1`, run); err != nil {
		return "", api.Retryable("record", "record end: %v", err)
	}
	return run, nil
}

// RecordRun records the start of rc's run on node in chaos_run, under a
// run id of its own, which it returns; a failure is a retryable error.
func RecordRun(ctx context.Context, pool *pgxpool.Pool, rc spi.RunContext, node string) (string, error) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	run := hex.EncodeToString(b)
	if _, err := pool.Exec(ctx, `INSERT INTO chaos_run (run_id, task_id, node, started) VALUES ($1, $2, $3, clock_timestamp())`,
		run, string(rc.TaskID()), node); err != nil {
		return "", api.Retryable("record", "record start: %v", err)
	}
	return run, nil
}

// Registry returns the behaviors of the suite's nodes and clients:
// chaos.work, chaos.limited, chaos.loose, chaos.node and those the
// package's Main added; pool is where their runs record themselves and
// node the name they record.
func Registry(pool *pgxpool.Pool, node string) *spi.Registry {
	reg := spi.NewRegistry()
	spi.MustRegister[WorkParams, string](reg, Work{Pool: pool, Node: node})
	spi.MustRegister[FlowParams, struct{}](reg, limited{pool: pool, node: node})
	spi.MustRegister[FlowParams, struct{}](reg, loose{limited{pool: pool, node: node}})
	spi.MustRegister[WorkParams, string](reg, wfNode{Work{Pool: pool, Node: node}})
	for _, r := range registers {
		r(reg, pool, node)
	}
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
		Lease = d
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
		return impl.NewServer(st, impl.ServerConfig{Node: node, Registry: Registry(st.Pool(), node), MaxWorkers: 50,
			PollInterval: 100 * time.Millisecond, HandOver: os.Getenv(envHandOver) != "", Logger: slog.New(slog.NewJSONHandler(out, nil))})
	}, opts...)
}

// Cluster is one scenario: a database, three node processes and a client.
type Cluster struct {
	// T is the scenario's test; Ctx ends with it, or after 10 minutes.
	T   *testing.T
	Ctx context.Context
	// DSN is the database's URL, and Pool the client's pool on it.
	DSN    string
	Pool   *pgxpool.Pool
	Client *impl.Client
	// Nodes are the node processes, not started until Start; a test may
	// change them (fewer, other URLs) before it starts them.
	Nodes []*Node
	kills []kill
	// Extra are tasks a fault acknowledged, checked with the workload's.
	Extra []api.TaskID
}

// Node is a node process: a server of the test binary run again (see
// package childtest).
type Node struct {
	// Name is the server's node name; DSN the URL it opens its store on.
	Name string
	DSN  string
	// Listen is the URL of its LISTEN connection, if not DSN.
	Listen string
	// Log is the node's log file, JSON lines.
	Log string
	// Lease is its behaviors' lease; zero means Lease.
	Lease time.Duration
	// Cmd and Child are the running process; Cmd is nil while it is not.
	Cmd   *exec.Cmd
	Child *childtest.Child
	// FreezeAt, if set, is the fault point (see internal/faultpoint) at
	// which the node process stops itself once armed by a SIGUSR1.
	FreezeAt string
	// HandOver turns on the node's hand-over (impl.ServerConfig.HandOver).
	HandOver bool
}

type kill struct {
	node string
	at   time.Time // database clock
}

// NewCluster is a scenario on a fresh database of the test binary's
// cluster (see pgtest.New).
func NewCluster(t *testing.T) *Cluster { return NewClusterAt(t, pgtest.New(t)) }

// NewClusterAt is NewCluster on the database at dsn, migrated; the
// tables of the suite's behaviors are created there unless they exist (a
// database restored from a backup of a scenario's has them).
func NewClusterAt(t *testing.T, dsn string) *Cluster {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	st, err := postgres.Open(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	_, err = st.Pool().Exec(ctx, `
		CREATE TABLE IF NOT EXISTS chaos_run (run_id text PRIMARY KEY, task_id text NOT NULL, node text NOT NULL, started timestamptz NOT NULL, ended timestamptz);
		CREATE TABLE IF NOT EXISTS chaos_result (run_id text PRIMARY KEY, task_id text NOT NULL, at timestamptz NOT NULL)`)
	require.NoError(t, err)
	client, err := impl.NewClient(st, impl.ClientConfig{Registry: Registry(st.Pool(), "client"), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	c := &Cluster{T: t, Ctx: ctx, DSN: dsn, Pool: st.Pool(), Client: client}
	logs := t.TempDir()
	if *keepLogs != "" {
		logs = filepath.Join(*keepLogs, strings.ReplaceAll(t.Name(), "/", "_"))
		require.NoError(t, os.MkdirAll(logs, 0o755))
	}
	for i := range 3 {
		name := fmt.Sprint("node-", i)
		c.Nodes = append(c.Nodes, &Node{Name: name, DSN: dsn, Log: filepath.Join(logs, name+".log")})
	}
	t.Cleanup(func() {
		for _, n := range c.Nodes {
			if n.Cmd != nil {
				_ = n.Cmd.Process.Kill()
				_ = n.Cmd.Wait()
			}
		}
	})
	return c
}

// Start starts a node process and waits until it is ready.
func (c *Cluster) Start(n *Node) {
	env := []string{envDSN + "=" + n.DSN, envNode + "=" + n.Name, envLog + "=" + n.Log, envListen + "=" + n.Listen}
	if n.Lease > 0 {
		env = append(env, envLease+"="+n.Lease.String())
	}
	if n.FreezeAt != "" {
		env = append(env, envFreezeAt+"="+n.FreezeAt)
	}
	if n.HandOver {
		env = append(env, envHandOver+"=1")
	}
	n.Child = childtest.Start(c.T, env...)
	n.Cmd = n.Child.Cmd
}

// StartAll starts every node.
func (c *Cluster) StartAll() {
	for _, n := range c.Nodes {
		c.Start(n)
	}
}

// Sigkill kills a node and records when, by the database clock.
func (c *Cluster) Sigkill(n *Node) {
	at := c.Clock()
	require.NoError(c.T, n.Cmd.Process.Kill())
	_ = n.Cmd.Wait()
	n.Cmd = nil
	c.kills = append(c.kills, kill{node: n.Name, at: at})
}

// Submit submits tasks 0..count-1 in batches, retrying each batch until
// it is acknowledged (a fault may fail a submit; it must then have stored
// all of the batch or none). It returns the acknowledged ids.
func (c *Cluster) Submit(count int) []api.TaskID { return c.SubmitFrom(0, count) }

// SubmitFrom is Submit of tasks first..first+count-1.
func (c *Cluster) SubmitFrom(first, count int) []api.TaskID {
	var ids []api.TaskID
	for start := first; start < first+count; start += 100 {
		reqs := make([]api.SubmitRequest, 0, 100)
		for n := start; n < min(start+100, first+count); n++ {
			reqs = append(reqs, api.SubmitRequest{Behavior: WorkKind.ID, Params: fmt.Appendf(nil, `{"n":%d,"sleep_ms":%d}`, n, mrand.IntN(150))})
		}
		for {
			subs, err := c.Client.SubmitMany(c.Ctx, reqs)
			if err == nil {
				for _, s := range subs {
					ids = append(ids, s.ID)
				}
				break
			}
			require.NoError(c.T, c.Ctx.Err(), "gave up submitting: %v", err)
			time.Sleep(50 * time.Millisecond) // backoff between retries of a failed submit
		}
	}
	return ids
}

// Report is the checker's verdict.
type Report struct {
	// Tasks were checked: OK finished, Lost did not, Duplicated had two
	// lease holders write a result, Recovered ran more than once, and
	// Unexpected results belong to no task checked.
	Tasks, OK, Lost, Duplicated, Recovered, Unexpected int
	// RecoveryMax and RecoveryMean are how long after a kill the tasks
	// it cut started again.
	RecoveryMax, RecoveryMean time.Duration
	// SlowestTakeover tells the story of the task whose takeover took
	// RecoveryMax.
	SlowestTakeover string
	// SlowestQuery is the longest a trivial query took while the fault
	// ran: how slow the machine was for the nodes and the database.
	SlowestQuery time.Duration
}

// String is the report on a line.
func (r Report) String() string {
	return fmt.Sprintf("tasks=%d ok=%d lost=%d duplicated=%d recovered=%d unexpected=%d recovery(max=%s mean=%s)",
		r.Tasks, r.OK, r.Lost, r.Duplicated, r.Recovered, r.Unexpected, r.RecoveryMax.Round(time.Millisecond), r.RecoveryMean.Round(time.Millisecond))
}

// Check waits for every acknowledged task to finish and classifies them.
// It waits while the tasks make progress: a task is lost when a minute
// (many leases) passes with no task finishing and it is still not done,
// so that a loaded machine, which only slows the work, does not count as
// losing it.
func (c *Cluster) Check(ids []api.TaskID) Report {
	want := make([]string, len(ids))
	for i, id := range ids {
		want[i] = string(id)
	}
	count := func(q string, args ...any) int {
		var n int
		require.NoError(c.T, c.Pool.QueryRow(c.Ctx, q, args...).Scan(&n))
		return n
	}
	done, progressed := 0, time.Now()
	for done < len(want) && time.Since(progressed) < time.Minute {
		time.Sleep(100 * time.Millisecond) // polling the database for quiescence, bounded by the progress deadline
		if n := count(`SELECT count(*) FROM stint_task WHERE id = ANY($1) AND status = 'success'`, want); n > done {
			done, progressed = n, time.Now()
		}
	}
	r := Report{Tasks: len(ids)}
	r.OK = count(`SELECT count(*) FROM stint_task WHERE id = ANY($1) AND status = 'success'`, want)
	r.Lost = r.Tasks - r.OK
	// Two results for one task where the second run started before the
	// first result was written: two lease holders both wrote.
	r.Duplicated = count(`SELECT count(DISTINCT r1.task_id) FROM chaos_result r1
		JOIN chaos_result r2 ON r2.task_id = r1.task_id AND r2.run_id <> r1.run_id
		JOIN chaos_run run2 ON run2.run_id = r2.run_id
		WHERE run2.started < r1.at AND r1.at <= r2.at`)
	r.Recovered = count(`SELECT count(*) FROM (SELECT task_id FROM chaos_run GROUP BY task_id HAVING count(*) > 1) x`)
	r.Unexpected = count(`SELECT count(*) FROM chaos_result WHERE NOT (task_id = ANY($1))`, want)
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
		rows, err := c.Pool.Query(c.Ctx, `
			SELECT cut.task_id, min(next.started) - $2 FROM chaos_run cut
			JOIN chaos_run next ON next.task_id = cut.task_id AND next.started > $2
			WHERE cut.node = $1 AND cut.started > $3 AND cut.started < $2 AND cut.ended IS NULL
			AND NOT EXISTS (SELECT 1 FROM chaos_run o WHERE o.task_id = cut.task_id AND o.started > cut.started AND o.started <= $2)
			GROUP BY cut.run_id, cut.task_id`, k.node, k.at, since)
		require.NoError(c.T, err)
		type takeover struct {
			Task string
			D    time.Duration
		}
		ds, err := pgx.CollectRows(rows, pgx.RowToStructByPos[takeover])
		require.NoError(c.T, err)
		for _, d := range ds {
			if d.D > r.RecoveryMax {
				r.RecoveryMax = d.D
				slowest.task, slowest.kill = d.Task, k
			}
			total += d.D
			n++
		}
	}
	if slowest.task != "" {
		// What the slowest takeover's task went through, for a failure's
		// reader: its runs and its changes of status.
		rows, err := c.Pool.Query(c.Ctx, `
			SELECT format('run %s on %s %s-%s', run_id, node, to_char(started, 'HH24:MI:SS.MS'), coalesce(to_char(ended, 'HH24:MI:SS.MS'), '')), started
			FROM chaos_run WHERE task_id = $1
			UNION ALL
			SELECT format('%s at %s', statuses[i], to_char(at, 'HH24:MI:SS.MS')), at
			FROM stint_change, generate_subscripts(task_ids, 1) i WHERE task_ids[i] = $1
			ORDER BY 2`, slowest.task)
		require.NoError(c.T, err)
		steps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
			var s string
			var at time.Time
			return s, row.Scan(&s, &at)
		})
		require.NoError(c.T, err)
		r.SlowestTakeover = fmt.Sprintf("%s killed at %s; task %s: %s", slowest.kill.node, slowest.kill.at.Format("15:04:05.000"),
			slowest.task, strings.Join(steps, ", "))
	}
	if n > 0 {
		r.RecoveryMean = total / time.Duration(n)
	}
	return r
}

// Scenario runs the workload with a fault going on until the workload is
// submitted and faultFor has passed, then checks.
func Scenario(t *testing.T, tasks int, faultFor time.Duration, fault func(c *Cluster, stop <-chan struct{})) Report {
	c := NewCluster(t)
	c.StartAll()
	return c.Scenario(tasks, faultFor, fault)
}

// Scenario is the package's Scenario on c, whose nodes run.
func (c *Cluster) Scenario(tasks int, faultFor time.Duration, fault func(c *Cluster, stop <-chan struct{})) Report {
	t := c.T
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { fault(c, stop) })
	var slowest time.Duration
	wg.Go(func() { slowest = c.slowestQuery(stop) })
	ids := c.Submit(tasks)
	time.Sleep(faultFor) // let the fault run over the workload: the duration is the test's parameter
	close(stop)
	wg.Wait()
	ids = append(ids, c.Extra...)
	for _, n := range c.Nodes {
		if n.Cmd == nil {
			c.Start(n)
		}
	}
	r := c.Check(ids)
	r.SlowestQuery = slowest
	t.Logf("%s: %s; slowest trivial query during the fault %s", t.Name(), r, slowest.Round(time.Millisecond))
	require.Zero(t, r.Lost, "lost tasks")
	require.Zero(t, r.Duplicated, "duplicated tasks")
	require.Zero(t, r.Unexpected, "unexpected results")
	return r
}

// Size is the workload of a scenario: how many tasks, and how long the
// fault lasts after they are submitted (ten times the tasks and a minute
// with -chaos.long).
func Size() (tasks int, faultFor time.Duration) {
	if *Long {
		return 20000, time.Minute
	}
	return 2000, 5 * time.Second
}

// slowestQuery runs a trivial query every 50 ms until stop and returns the
// longest one took.
func (c *Cluster) slowestQuery(stop <-chan struct{}) time.Duration {
	var slowest time.Duration
	Every(stop, 0, 50*time.Millisecond, func() {
		start := time.Now()
		if _, err := c.Pool.Exec(c.Ctx, `SELECT 1`); err == nil {
			slowest = max(slowest, time.Since(start))
		}
	})
	return slowest
}

// Every calls fn after first, then every d, until stop.
func Every(stop <-chan struct{}, first, d time.Duration, fn func()) {
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

// Clock reads the database's clock.
func (c *Cluster) Clock() time.Time {
	var at time.Time
	require.NoError(c.T, c.Pool.QueryRow(c.Ctx, `SELECT clock_timestamp()`).Scan(&at))
	return at
}
