package chaos

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The database incidents a node must ride through (a silent network
// loss, writes refused, a full disk, a server in recovery, a failover to
// a promoted standby, a PgBouncer restart): each test runs the workload,
// injects the incident (Incident), checks the ledger (nothing
// acknowledged lost, no duplicate effect), and checks and reports what
// the nodes logged (CheckIncidents): each incident once when it starts,
// at most one line a second while it lasts, once when it ends.

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
func incidentLines(t *testing.T, n *Node) []logLine {
	f, err := os.Open(n.Log)
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

// IncidentReport is what the nodes logged of an incident that lasted from
// start to end (the fault's times).
type IncidentReport struct {
	// Detect is, per node, how long after start its first incident line
	// came; Resume how long after end its last incident ended.
	Detect, Resume map[string]time.Duration
	Causes         map[string]map[string]int // node -> cause -> lines
}

// String is the report on a line, node by node.
func (r IncidentReport) String() string {
	s := ""
	for n, d := range r.Detect {
		s += fmt.Sprintf(" %s(detected=%s ended=+%s lines=%v)", n, d.Round(time.Millisecond), r.Resume[n].Round(time.Millisecond), r.Causes[n])
	}
	return s
}

// CheckIncidents checks the nodes' incident lines: every node saw the
// incident (with each of the causes want), every incident it saw ended,
// and no cause took more than a line a second (plus its start and end
// lines) between start and the last line.
func (c *Cluster) CheckIncidents(start, end time.Time, want ...string) IncidentReport {
	t := c.T
	r := IncidentReport{Detect: map[string]time.Duration{}, Resume: map[string]time.Duration{}, Causes: map[string]map[string]int{}}
	for _, n := range c.Nodes {
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
		}, time.Minute, 100*time.Millisecond, "%s: an incident did not end: %v", n.Name, lines)
		require.NotEmpty(t, lines, "%s logged no incident", n.Name)
		r.Causes[n.Name] = map[string]int{}
		first, last := lines[0].Time, lines[0].Time
		for _, l := range lines {
			r.Causes[n.Name][l.Cause]++
			last = l.Time
			if l.Msg == msgEnded {
				last = l.At
			}
		}
		r.Detect[n.Name] = first.Sub(start)
		r.Resume[n.Name] = last.Sub(end)
		for _, cause := range want {
			require.Positive(t, r.Causes[n.Name][cause], "%s logged no %s incident: %v", n.Name, cause, lines)
		}
		for cause, count := range r.Causes[n.Name] {
			if count > 3 { // more than one incident of a cause: show them
				for _, l := range lines {
					if l.Cause == cause {
						t.Logf("%s: %s %s %s %s %s", n.Name, l.Time.Format("15:04:05.000"), l.Msg, l.Cause, l.Op, l.Err)
					}
				}
			}
		}
		secs := int(last.Sub(first).Seconds())
		for cause, count := range r.Causes[n.Name] {
			require.LessOrEqual(t, count, secs+2, "%s: %d lines of %s in %d s: more than one a second", n.Name, count, cause, secs)
		}
	}
	return r
}

// FirstRunAfter returns how long after at (a time of this machine, as is
// the database's clock in these tests) the first run of any task
// started.
func (c *Cluster) FirstRunAfter(at time.Time) time.Duration {
	var first time.Time
	require.Eventually(c.T, func() bool {
		err := c.Pool.QueryRow(c.Ctx, `SELECT min(started) FROM chaos_run WHERE started > $1`, at).Scan(&first)
		return err == nil && !first.IsZero()
	}, 2*time.Minute, 50*time.Millisecond, "no run started after %s", at)
	return first.Sub(at)
}

// MustURL parses dsn, failing the test if it cannot.
func MustURL(t *testing.T, dsn string) *url.URL {
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	return u
}

// IncidentFor is how long an incident lasts: short in the short mode, a
// minute in the long one.
func IncidentFor(short time.Duration) time.Duration {
	if *Long {
		return time.Minute
	}
	return short
}

// BehindProxy puts every node (not started yet) behind a proxy of its
// own to the database, which it returns.
func (c *Cluster) BehindProxy() *Proxy {
	u := MustURL(c.T, c.DSN)
	p, err := NewProxy(u.Host)
	require.NoError(c.T, err)
	c.T.Cleanup(p.Close)
	u.Host = p.Addr()
	for _, n := range c.Nodes {
		n.DSN = u.String()
	}
	return p
}

// Incident runs the workload with an incident: begin starts it 300 ms
// in, while the workload runs; it lasts for; end ends it. Then it checks
// the ledger and the nodes' incident lines (with the causes want), and
// logs what it measured: each node's detection and end, and when the
// first run started after the incident's end.
func (c *Cluster) Incident(what string, lasts time.Duration, begin, end func(), want ...string) IncidentReport {
	var began, ended time.Time
	tasks, _ := Size()
	c.Scenario(tasks, time.Second, func(c *Cluster, stop <-chan struct{}) {
		time.Sleep(300 * time.Millisecond) // the incident comes while the workload runs
		began = time.Now()
		begin()
		time.Sleep(lasts) // the incident's duration
		end()
		ended = time.Now()
	})
	resume := c.FirstRunAfter(ended)
	r := c.CheckIncidents(began, ended, want...)
	c.T.Logf("measured: %s for %s: first run %s after it ended;%s", what, lasts, resume.Round(time.Millisecond), r)
	return r
}
