package postgres_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// What listenProxy does with a connection it accepts.
const (
	proxyForward int32 = iota // forwards it to the database
	proxyHold                 // keeps it open and never answers: a silent loss
	proxyRefuse               // closes it at once: a database that is down
	proxyDelay                // forwards it once released: a path that comes back
)

// listenProxy stands between a store's listener and PostgreSQL: it
// forwards, holds or refuses each connection it accepts, as its mode was
// when it accepted it, so that a connection held stays silent after the
// proxy forwards again, as after a NAT table lost it.
type listenProxy struct {
	ln       net.Listener
	target   string
	mode     atomic.Int32
	accepted chan int32 // the mode of each connection accepted

	mu    sync.Mutex
	conns []net.Conn
	// released is closed by release, which lets the connections accepted
	// in proxyDelay through.
	released chan struct{}
}

// release forwards the connections accepted in proxyDelay.
func (p *listenProxy) release() { close(p.released) }

func newListenProxy(t *testing.T, target string) *listenProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &listenProxy{ln: ln, target: target, accepted: make(chan int32, 1000), released: make(chan struct{})}
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.handle(c)
		}
	}()
	return p
}

func (p *listenProxy) handle(c net.Conn) {
	mode := p.mode.Load()
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
	p.accepted <- mode
	switch mode {
	case proxyRefuse:
		_ = c.Close()
	case proxyForward, proxyDelay:
		if mode == proxyDelay {
			<-p.released
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, server)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(server, c); _ = server.Close() }()
		go func() { _, _ = io.Copy(c, server); _ = c.Close() }()
	}
}

// listenVia opens a store on dsn whose listener connects through a new
// listenProxy, and listens until the test ends; its states receive what
// the listener reports (nil: it listens).
func listenVia(t *testing.T, dsn string, mode int32) (*postgres.Store, *listenProxy, <-chan error) {
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	require.NotEmpty(t, u.Port(), "the test database is reached over TCP")
	p := newListenProxy(t, u.Host)
	p.mode.Store(mode)
	u.Host = p.ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := postgres.Open(ctx, dsn, postgres.ListenDSN(u.String()))
	require.NoError(t, err)
	states := make(chan error, 1000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = st.Listen(ctx, []string{store.ChannelDue}, func(string, string) {}, func(err error) { states <- err })
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		st.Close()
	})
	return st, p, states
}

// answerAgain lets the path forward new connections again, has a
// statement of the pool succeed, tells the store the database answers,
// and waits for the listener to listen within answeredBound.
func answerAgain(t *testing.T, st *postgres.Store, p *listenProxy, states <-chan error) {
	t.Helper()
	p.mode.Store(proxyForward)
	_, err := st.Pool().Exec(context.Background(), `SELECT 1`)
	require.NoError(t, err)
	st.DatabaseAnswered()
	waitListening(t, states, answeredBound)
}

// waitConnect waits for the listener's first connection through p, and
// checks that p met it in mode.
func waitConnect(t *testing.T, p *listenProxy, mode int32) {
	t.Helper()
	select {
	case m := <-p.accepted:
		require.Equal(t, mode, m)
	case <-time.After(time.Minute):
		t.Fatal("the listener did not connect")
	}
}

// waitListening waits up to bound for the listener to report that it
// listens, and fails the test if it does not.
func waitListening(t *testing.T, states <-chan error, bound time.Duration) {
	t.Helper()
	deadline := time.After(bound)
	for {
		select {
		case err := <-states:
			if err == nil {
				return
			}
		case <-deadline:
			t.Fatalf("the listener did not listen within %s", bound)
		}
	}
}

// answeredBound is how soon after the database answers again the
// listener must listen: a connection's set-up, with room for a loaded
// machine, and well under the connect_timeout (10 s) and the backoff
// (5 s) it would otherwise wait out.
const answeredBound = 3 * time.Second

// TestListenerGivesUpAHangingConnectWhenTheDatabaseAnswers checks that a
// listener whose connection attempt hangs on a dead path gives it up and
// listens on a new connection as soon as the store is told that the
// database answers again, rather than after the attempt's connect_timeout.
func TestListenerGivesUpAHangingConnectWhenTheDatabaseAnswers(t *testing.T) {
	t.Parallel()
	st, p, states := listenVia(t, pgtest.New(t), proxyHold)
	waitConnect(t, p, proxyHold)
	// The path is back for new connections; the one in flight stays
	// silent.
	answerAgain(t, st, p, states)
}

// TestListenerCutsItsBackoffShortWhenTheDatabaseAnswers checks that a
// listener that failed until its backoff grew to 5 s listens as soon as
// the store is told that the database answers again.
func TestListenerCutsItsBackoffShortWhenTheDatabaseAnswers(t *testing.T) {
	t.Parallel()
	st, p, states := listenVia(t, pgtest.New(t), proxyRefuse)
	// The backoff doubles from 100 ms at each failure: after the sixth
	// it is 5 s.
	for failures := 0; failures < 6; {
		select {
		case err := <-states:
			require.Error(t, err)
			failures++
		case <-time.After(time.Minute):
			t.Fatalf("the listener reported %d failures, want 6", failures)
		}
	}
	answerAgain(t, st, p, states)
}

// TestListenerKeepsAConnectThatTheReturningPathLetsThrough checks that a
// listener's connection attempt made while the path was down, which the
// path lets through when it comes back, goes on when the store is told
// that the database answers again: it listens on that connection, with no
// failure reported.
func TestListenerKeepsAConnectThatTheReturningPathLetsThrough(t *testing.T) {
	t.Parallel()
	st, p, states := listenVia(t, pgtest.New(t), proxyDelay)
	waitConnect(t, p, proxyDelay)
	p.mode.Store(proxyForward)
	p.release()
	st.DatabaseAnswered()
	select {
	case err := <-states:
		require.NoError(t, err, "the attempt the path let through should listen")
	case <-time.After(answeredBound):
		t.Fatalf("the listener did not listen within %s", answeredBound)
	}
	require.Len(t, p.accepted, 0, "no other connection")
}
