package replication

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// proxy is a TCP proxy to a PostgreSQL server that can be taken down (it
// refuses new connections and cuts open ones) and up again: a source that
// becomes unreachable.
type proxy struct {
	ln       net.Listener
	upstream string
	up       atomic.Bool
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

func newProxy(t *testing.T, upstream string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, upstream: upstream, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { _ = ln.Close(); p.setUp(false) })
	go p.serve()
	return p
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.up.Load() {
			_ = c.Close()
			continue
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[u] = true, true
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
		}
		go pipe(c, u)
		go pipe(u, c)
	}
}

// setUp takes the proxy up or down; down cuts every open connection.
func (p *proxy) setUp(up bool) {
	p.up.Store(up)
	if up {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// dsn returns dsn's database through the proxy.
func (p *proxy) dsn(t *testing.T, dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	addr := p.ln.Addr().(*net.TCPAddr)
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", cfg.User, addr.Port, cfg.Database)
}

// crash is one failed run seen on the task, with database timestamps.
type crash struct {
	executed, finished, due time.Time
	errors                  int // the replication's crash count
}

// TestBackoffGrowsAndHealingResetsIt fails a replication repeatedly with an
// unreachable source and measures the penalties on the database clock:
// min * 2^min(n, log2(max/min)) jittered to 75-100%, with min 200 ms and max
// 1.6 s. Then the source comes back, the replication runs healthy for the
// health threshold (1 s) and the count resets: the next crash gets the
// first penalty again.
func TestBackoffGrowsAndHealingResetsIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.makeTables("items", 1000)
	cfg, err := pgconn.ParseConfig(e.srcDSN)
	require.NoError(t, err)
	px := newProxy(t, fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	rc := testConfig(e.st.Pool())
	srv := e.server("node", rc)

	p := e.params("items")
	p.Source.DSN = px.dsn(t, e.srcDSN)
	f := submit(t, e.ctx, srv, p, true)

	// seen collects the distinct crashes of the task.
	var seen []crash
	observe := func() {
		task, prog := progress(t, e.ctx, srv, f.ID())
		if task.Status != api.StatusFailure || task.FinishedAt == nil || task.ExecutedAt == nil || task.ScheduleNotBefore == nil {
			return
		}
		if len(seen) > 0 && seen[len(seen)-1].finished.Equal(*task.FinishedAt) {
			return
		}
		seen = append(seen, crash{executed: *task.ExecutedAt, finished: *task.FinishedAt, due: *task.ScheduleNotBefore, errors: prog.Errors})
	}
	waitFor(t, time.Minute, "five crashes", func() bool { observe(); return len(seen) == 5 })
	task, err := srv.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, StateCrashing, StateOf(task))
	require.Equal(t, codeSource, task.Error.Code)

	check := func(c crash, n int) {
		t.Helper()
		full := FullPenalty(rc.MinBackoff, rc.MaxBackoff, n)
		delay := c.due.Sub(c.finished)
		require.Equal(t, n, c.errors, "crash count")
		require.GreaterOrEqual(t, delay, full*3/4-time.Millisecond, "crash %d: penalty at least 75%% of %s", n, full)
		require.LessOrEqual(t, delay, full+time.Millisecond, "crash %d: penalty at most %s", n, full)
	}
	for i, c := range seen {
		check(c, i+1)
		if i > 0 {
			// The retry ran once due, not before (and soon after).
			gap := c.executed.Sub(seen[i-1].finished)
			wait := seen[i-1].due.Sub(seen[i-1].finished)
			require.GreaterOrEqual(t, gap, wait, "crash %d ran before its penalty ended", i+1)
			require.Less(t, gap, wait+time.Second, "crash %d ran long after its penalty", i+1)
			t.Logf("crash %d: penalty %s (full %s), retried %s after the crash", i, wait.Round(time.Millisecond),
				FullPenalty(rc.MinBackoff, rc.MaxBackoff, i).Round(time.Millisecond), gap.Round(time.Millisecond))
		}
	}

	// The source comes back: the replication catches up and, healthy for
	// the threshold, resets its count.
	px.setUp(true)
	waitFor(t, 30*time.Second, "the replication to heal", func() bool {
		task, prog := progress(t, e.ctx, srv, f.ID())
		return StateOf(task) == StateRunning && prog.Errors == 0 && prog.Seq > 0
	})
	e.requireEqual("items", "", "items")
	task, err = srv.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, 5, task.Errors, "the engine still counts five failures; the replication's own count healed")

	// It fails again: the first penalty, not the sixth.
	healedAt := len(seen)
	px.setUp(false)
	waitFor(t, 30*time.Second, "a crash after healing", func() bool { observe(); return len(seen) > healedAt })
	check(seen[healedAt], 1)
	t.Logf("after healing: penalty %s (full %s)", seen[healedAt].due.Sub(seen[healedAt].finished).Round(time.Millisecond),
		FullPenalty(rc.MinBackoff, rc.MaxBackoff, 1))
	require.NoError(t, srv.Remove(e.ctx, f.ID()))
}

func TestPenaltyBounds(t *testing.T) {
	t.Parallel()
	lo, hi := DefaultMinBackoff, DefaultMaxBackoff
	require.Equal(t, 64*time.Second, FullPenalty(lo, hi, 1))
	require.Equal(t, 128*time.Second, FullPenalty(lo, hi, 2))
	require.Equal(t, 32*4096*time.Second, FullPenalty(lo, hi, 12))
	require.Equal(t, hi, FullPenalty(lo, hi, 13), "capped at max")
	require.Equal(t, hi, FullPenalty(lo, hi, 1000))
	for n := 1; n < 20; n++ {
		for range 50 {
			d := Penalty(lo, hi, n)
			full := FullPenalty(lo, hi, n)
			require.GreaterOrEqual(t, d, full*3/4)
			require.LessOrEqual(t, d, full)
		}
	}
	cfg := Config{MaxBackoff: 365 * 24 * time.Hour}.withDefaults()
	require.Equal(t, 30*24*time.Hour, cfg.MaxBackoff, "max penalty capped at 30 days")
}
