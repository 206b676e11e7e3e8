package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgcluster"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store/postgres"
)

// The database incidents a node must ride through: a silent network
// loss, writes refused, a server in recovery, a failover to a promoted
// standby. Each test runs the workload, injects the incident, checks the
// ledger (nothing acknowledged lost, no duplicate effect), and checks and
// reports what the nodes logged: each incident once when it starts, at
// most one line a second while it lasts, once when it ends.

// logLine is a line of a node's JSON log.
type logLine struct {
	Time  time.Time `json:"time"`
	At    time.Time `json:"at"` // an end line's time of the success that ended it
	Msg   string    `json:"msg"`
	Cause string    `json:"cause"`
	Op    string    `json:"op"`
	Err   string    `json:"err"`
}

// Messages of the incident lines (see impl's incidents).
const (
	msgStarted = "stint: database incident started; retrying"
	msgGoesOn  = "stint: database incident goes on; retrying"
	msgEnded   = "stint: database incident ended"
)

// incidentLines returns the incident lines of n's log.
func incidentLines(t *testing.T, n *node) []logLine {
	f, err := os.Open(n.log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	defer f.Close()
	var out []logLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l logLine
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l), "log line %q", sc.Text())
		if l.Msg == msgStarted || l.Msg == msgGoesOn || l.Msg == msgEnded {
			out = append(out, l)
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// incidentReport is what the nodes logged of an incident that lasted from
// start to end (the fault's times).
type incidentReport struct {
	// detect is, per node, how long after start its first incident line
	// came; resume how long after end its last incident ended.
	detect, resume map[string]time.Duration
	causes         map[string]map[string]int // node -> cause -> lines
}

func (r incidentReport) String() string {
	s := ""
	for n, d := range r.detect {
		s += fmt.Sprintf(" %s(detected=%s ended=+%s lines=%v)", n, d.Round(time.Millisecond), r.resume[n].Round(time.Millisecond), r.causes[n])
	}
	return s
}

// checkIncidents checks the nodes' incident lines: every node saw the
// incident (with each of the causes want), every incident it saw ended,
// and no cause took more than a line a second (plus its start and end
// lines) between start and the last line.
func (c *cluster) checkIncidents(start, end time.Time, want ...string) incidentReport {
	t := c.t
	r := incidentReport{detect: map[string]time.Duration{}, resume: map[string]time.Duration{}, causes: map[string]map[string]int{}}
	for _, n := range c.nodes {
		var lines []logLine
		// The end lines follow the first success after the fault: the
		// ledger's check waited for the work, so they are written.
		require.Eventually(t, func() bool {
			lines = incidentLines(t, n)
			open := map[string]bool{}
			for _, l := range lines {
				open[l.Cause] = l.Msg != msgEnded
			}
			for _, o := range open {
				if o {
					return false
				}
			}
			return true
		}, time.Minute, 100*time.Millisecond, "%s: an incident did not end: %v", n.name, lines)
		require.NotEmpty(t, lines, "%s logged no incident", n.name)
		r.causes[n.name] = map[string]int{}
		first, last := lines[0].Time, lines[0].Time
		for _, l := range lines {
			r.causes[n.name][l.Cause]++
			last = l.Time
			if l.Msg == msgEnded {
				last = l.At
			}
		}
		r.detect[n.name] = first.Sub(start)
		r.resume[n.name] = last.Sub(end)
		for _, cause := range want {
			require.Positive(t, r.causes[n.name][cause], "%s logged no %s incident: %v", n.name, cause, lines)
		}
		for cause, count := range r.causes[n.name] {
			if count > 3 { // more than one incident of a cause: show them
				for _, l := range lines {
					if l.Cause == cause {
						t.Logf("%s: %s %s %s %s %s", n.name, l.Time.Format("15:04:05.000"), l.Msg, l.Cause, l.Op, l.Err)
					}
				}
			}
		}
		secs := int(last.Sub(first).Seconds())
		for cause, count := range r.causes[n.name] {
			require.LessOrEqual(t, count, secs+2, "%s: %d lines of %s in %d s: more than one a second", n.name, count, cause, secs)
		}
	}
	return r
}

// firstRunAfter returns how long after at (a time of this machine, as is
// the database's clock in these tests) the first run of any task
// started.
func (c *cluster) firstRunAfter(at time.Time) time.Duration {
	var first time.Time
	require.Eventually(c.t, func() bool {
		err := c.pool.QueryRow(c.ctx, `SELECT min(started) FROM chaos_run WHERE started > $1`, at).Scan(&first)
		return err == nil && !first.IsZero()
	}, 2*time.Minute, 50*time.Millisecond, "no run started after %s", at)
	return first.Sub(at)
}

func mustURL(t *testing.T, dsn string) *url.URL {
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	return u
}

// incidentFor is how long an incident lasts: short in the short mode, a
// minute in the long one.
func incidentFor(short time.Duration) time.Duration {
	if *long {
		return time.Minute
	}
	return short
}

// behindProxy puts every node (not started yet) behind a proxy of its
// own to the database, which it returns.
func (c *cluster) behindProxy() *proxy {
	u := mustURL(c.t, c.dsn)
	p, err := newProxy(u.Host)
	require.NoError(c.t, err)
	c.t.Cleanup(p.close)
	u.Host = p.addr()
	for _, n := range c.nodes {
		n.dsn = u.String()
	}
	return p
}

// incident runs the workload with an incident: begin starts it 300 ms
// in, while the workload runs; it lasts for; end ends it. Then it checks
// the ledger and the nodes' incident lines (with the causes want), and
// logs what it measured: each node's detection and end, and when the
// first run started after the incident's end.
func (c *cluster) incident(what string, lasts time.Duration, begin, end func(), want ...string) incidentReport {
	var began, ended time.Time
	tasks, _ := size()
	c.scenario(tasks, time.Second, func(c *cluster, stop <-chan struct{}) {
		time.Sleep(300 * time.Millisecond) // the incident comes while the workload runs
		began = time.Now()
		begin()
		time.Sleep(lasts) // the incident's duration
		end()
		ended = time.Now()
	})
	resume := c.firstRunAfter(ended)
	r := c.checkIncidents(began, ended, want...)
	c.t.Logf("measured: %s for %s: first run %s after it ended;%s", what, lasts, resume.Round(time.Millisecond), r)
	return r
}

func TestSilentNetworkLoss(t *testing.T) {
	c := newCluster(t)
	// What the README asks of the server for silent losses: the backend
	// of a client that vanished in a transaction would hold its locks
	// until the server's TCP keepalive gives up (never, on this
	// loopback: the proxy's end answers).
	_, err := c.pool.Exec(c.ctx, fmt.Sprintf(`ALTER DATABASE %s SET idle_in_transaction_session_timeout = '5s'`,
		pgx.Identifier{strings.TrimPrefix(mustURL(t, c.dsn).Path, "/")}.Sanitize()))
	require.NoError(t, err)
	p := c.behindProxy() // every node: none can work during the loss
	c.startAll()
	// Past every detection bound (10 s for the listener).
	c.incident("silent network loss", incidentFor(12*time.Second), func() {
		p.blackhole()
		// Tasks submitted during the loss (the client is not behind the
		// proxy) start once the path is back.
		c.extra = c.submitFrom(1_000_000, 20)
	}, func() {
		p.restore(true) // the connections of before stay dead, never closed
	}, impl.CauseListener, impl.CauseUnreachable) // the listener's dead connection: only its own check finds it out
}

func TestWritesRefused(t *testing.T) {
	if pgtest.Cluster() == nil {
		t.Skip("the cluster is not this test binary's (STINT_TEST_DATABASE_URL is set): ALTER SYSTEM would change another server")
	}
	c := newCluster(t)
	c.startAll()
	setReadOnly := func(on bool) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin, err := pgx.Connect(ctx, c.dsn)
		require.NoError(t, err)
		defer admin.Close(ctx)
		q := `ALTER SYSTEM RESET default_transaction_read_only`
		if on {
			q = `ALTER SYSTEM SET default_transaction_read_only = on`
		}
		// The session turning writes on again must itself be able to.
		for _, q := range []string{`SET default_transaction_read_only = off`, q, `SELECT pg_reload_conf()`} {
			_, err := admin.Exec(ctx, q)
			require.NoError(t, err)
		}
	}
	t.Cleanup(func() { setReadOnly(false) })
	var refused error
	c.incident("writes refused", incidentFor(5*time.Second), func() {
		setReadOnly(true)
		require.Eventually(t, func() bool {
			var sub api.Submission
			sub, refused = c.client.Submit(c.ctx, api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"n":2000000}`)})
			if refused == nil && !slices.Contains(c.extra, sub.ID) {
				c.extra = append(c.extra, sub.ID) // before the reload reached the session
			}
			return refused != nil
		}, time.Minute, 50*time.Millisecond, "a submit should be refused")
	}, func() { setReadOnly(false) }, impl.CauseReadOnly)
	require.ErrorIs(t, refused, api.ErrReadOnly)
	require.ErrorIs(t, refused, api.ErrUnavailable)
	require.ErrorContains(t, refused, "accepts no writes")
	t.Logf("the refused submit's error: %v", refused)
}

// replicated starts a primary of the test's own, with a database "stint"
// migrated, and a streaming standby of it (synchronous when sync: every
// commit waits for the standby to flush it), and returns them with the
// multi-host URL of both that asks for the read-write one.
func replicated(t *testing.T, sync bool) (primary, standby *pgcluster.Cluster, dsn string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	primary, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: pgtest.TempDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = primary.Stop() })
	conn, err := pgx.Connect(ctx, primary.DSN("postgres"))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, `CREATE DATABASE stint`)
	require.NoError(t, err)
	st, err := postgres.Open(ctx, primary.DSN("stint"), postgres.Migrate())
	require.NoError(t, err)
	st.Close()
	standby, err = primary.StartStandby(ctx, pgtest.TempDir(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = standby.Stop() })
	require.NoError(t, pgcluster.WaitReplayed(ctx, primary.DSN("postgres"), standby.DSN("postgres")))
	if sync {
		_, err = conn.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = '*'`)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `SELECT pg_reload_conf()`)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			var n int
			err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'`).Scan(&n)
			return err == nil && n == 1
		}, time.Minute, 50*time.Millisecond, "the standby should become synchronous")
	}
	dsn = "postgres://postgres@127.0.0.1:" + strconv.Itoa(primary.Port()) + ",127.0.0.1:" + strconv.Itoa(standby.Port()) +
		"/stint?sslmode=disable&target_session_attrs=read-write"
	return primary, standby, dsn
}

// promoteAfter stands for the failover manager's detection of a dead
// primary: the tests promote the standby this long after killing it.
const promoteAfter = 2 * time.Second

func TestFailoverToAPromotedStandby(t *testing.T) {
	t.Parallel() // on clusters of its own: beside the other failover tests, once the shared cluster's are done
	primary, standby, dsn := replicated(t, true)
	c := newClusterAt(t, dsn)
	c.startAll()
	// The nodes meet it as unreachable, shutdown or recovery, as it comes.
	c.incident("failover (the synchronous standby promoted after the primary's SIGKILL)", incidentFor(promoteAfter),
		func() { require.NoError(t, primary.Kill()) },
		func() { require.NoError(t, standby.Promote(c.ctx)) })
}

func TestRecoveryMode(t *testing.T) {
	t.Parallel() // on clusters of its own: beside the other failover tests, once the shared cluster's are done
	primary, standby, dsn := replicated(t, true)
	c := newClusterAt(t, dsn)
	p, err := newProxy("127.0.0.1:" + strconv.Itoa(primary.Port()))
	require.NoError(t, err)
	t.Cleanup(p.close)
	u, err := url.Parse(primary.DSN("stint"))
	require.NoError(t, err)
	u.Host = p.addr()
	for _, n := range c.nodes {
		n.dsn = u.String() // one host, whatever server answers there
	}
	c.startAll()
	// A client pointed at the standby alone.
	st, err := postgres.Open(c.ctx, standby.DSN("stint"))
	require.NoError(t, err)
	t.Cleanup(st.Close)
	onStandby, err := impl.NewClient(st, impl.ClientConfig{Registry: registry(st.Pool(), "standby")})
	require.NoError(t, err)
	t.Cleanup(onStandby.Close)
	var refused error
	c.incident("recovery mode", incidentFor(5*time.Second), func() {
		// The server behind the nodes' address restarts in recovery: a
		// standby now answers there.
		require.NoError(t, primary.Kill())
		p.retarget("127.0.0.1:" + strconv.Itoa(standby.Port()))
		p.cut()
		_, refused = onStandby.Submit(c.ctx, api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"n":2000000}`)})
	}, func() { require.NoError(t, standby.Promote(c.ctx)) }, impl.CauseReadOnly)
	require.ErrorIs(t, refused, api.ErrReadOnly)
	t.Logf("the refused submit's error: %v", refused)
}

func TestPgBouncerRestart(t *testing.T) {
	pgtest.PgBouncerPath(t) // installs PgBouncer, or skips, before the deadlines start
	c := newCluster(t)
	bouncer := pgtest.StartPgBouncer(t, c.dsn)
	for _, n := range c.nodes {
		// Transaction mode cannot carry LISTEN: the nodes listen on a
		// direct connection.
		n.dsn, n.listen = bouncer.URL, c.dsn
	}
	c.startAll()
	// The workload's client submits through PgBouncer too.
	st, err := postgres.Open(c.ctx, bouncer.URL, postgres.ListenDSN(c.dsn))
	require.NoError(t, err)
	t.Cleanup(st.Close)
	c.client, err = impl.NewClient(st, impl.ClientConfig{Registry: registry(st.Pool(), "client")})
	require.NoError(t, err)
	t.Cleanup(c.client.Close)
	c.incident("PgBouncer restart", incidentFor(2*time.Second), bouncer.Kill, bouncer.Restart, impl.CauseUnreachable)
}
