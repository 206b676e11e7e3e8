package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Listen calls fn for each notification on channels until ctx ends. It
// holds one connection of its own, outside the pool, checks it whenever
// ListenCheck passes without a notification, and makes a new one when it
// breaks or stops answering, forever, with a backoff of up to 5 seconds
// between failed attempts. When the database answers again after an
// incident (DatabaseAnswered), it does not wait: it cuts its backoff
// short, gives up a connection attempt begun before that the server does
// not answer within answeredGrace (it may wait on a dead path for its
// whole connect_timeout) and makes it again at once, and checks the
// connection it listens on. After each (re)connection it calls
// fn with an empty payload on every channel, since notifications sent
// while it was not listening are lost. onState, if set, is told of every
// failure (err) and of every connection that listens again (nil).
func (s *Store) Listen(ctx context.Context, channels []string, fn func(channel, payload string), onState func(error)) error {
	if s.noListen {
		<-ctx.Done()
		return ctx.Err()
	}
	if onState == nil {
		onState = func(error) {}
	}
	const first = 100 * time.Millisecond
	backoff := first
	// mayAbandon is false for the attempt made at once after one was
	// given up: that one goes on to its end whatever the pool says, so
	// that answers that come one after another cannot keep the listener
	// from ever connecting.
	mayAbandon := true
	for {
		round := s.answered.round()
		listened, err := s.listenOnce(ctx, channels, fn, onState, mayAbandon)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		onState(err)
		if errors.Is(err, errAnswered) {
			mayAbandon = false
			continue
		}
		mayAbandon = true
		switch {
		case listened:
			// The connection worked until it broke: a new outage starts
			// its backoff afresh.
			backoff = first
		case err != nil:
			backoff = min(backoff*2, 5*time.Second)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		case <-round.Done():
			// The database answered since this attempt began.
			t.Stop()
		}
	}
}

// listenOnce listens on one connection until it breaks. listened reports
// whether it got as far as listening on every channel. With mayAbandon,
// the connection's set-up is given up when the database answers
// meanwhile and the connection hears nothing from the server within
// answeredGrace after (see abandonSilent), and err then wraps errAnswered.
func (s *Store) listenOnce(ctx context.Context, channels []string, fn func(channel, payload string), onState func(error), mayAbandon bool) (listened bool, err error) {
	setup, stop := ctx, func() {}
	cfg := s.listenConfig
	if mayAbandon {
		setup, stop, cfg = s.abandonSilent(ctx)
	}
	conn, err := listenConn(setup, cfg, channels)
	abandoned := context.Cause(setup) == errAnswered
	stop()
	if err != nil {
		if abandoned && ctx.Err() == nil {
			return false, fmt.Errorf("%w: %w", errAnswered, err)
		}
		return false, err
	}
	defer conn.Close(context.Background())
	onState(nil)
	for _, ch := range channels {
		fn(ch, "")
	}
	for {
		n, err := s.waitNotification(ctx, conn, ListenCheck)
		if err != nil {
			return true, fmt.Errorf("listen: %w", err)
		}
		fn(n.Channel, n.Payload)
	}
}

// answeredGrace is how long after the database answers again a
// connection attempt of the listener may go without hearing from the
// server before it is given up: once the path is back, a live attempt
// hears the server's next message within a round trip.
const answeredGrace = time.Second

// abandonSilent returns, for one connection attempt of the listener, a
// context that is cancelled, with the cause errAnswered, when the database
// answers again (DatabaseAnswered) and the attempt's socket then hears
// nothing from the server within answeredGrace: an attempt made while the
// path was dead may never be answered, and would wait out its whole
// connect_timeout (10 s), while one that the returning path lets through
// goes on. cfg is the listener's configuration with a dialer that tells
// it the socket; stop releases the context.
func (s *Store) abandonSilent(ctx context.Context) (setup context.Context, stop func(), cfg *pgx.ConnConfig) {
	round := s.answered.round()
	var sock atomic.Pointer[socket]
	cfg = s.listenConfig.Copy()
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if sc, ok := c.(*socket); ok {
			sock.Store(sc)
		}
		return c, err
	}
	setup, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		select {
		case <-round.Done():
		case <-done:
			return
		}
		at := time.Now()
		t := time.NewTimer(answeredGrace)
		defer t.Stop()
		select {
		case <-t.C:
		case <-done:
			return
		}
		if sc := sock.Load(); sc != nil && sc.heard.Load() >= at.UnixNano() {
			return // the server answers it: let it go on
		}
		cancel(errAnswered)
	}()
	return setup, func() {
		close(done)
		cancel(nil)
	}, cfg
}

// listenConn connects with cfg, sets the session's timeouts and listens
// on channels, each step bounded by ListenCheck as well as by ctx.
func listenConn(ctx context.Context, cfg *pgx.ConnConfig, channels []string) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("listen: connect: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, ListenCheck)
	err = setServerTimeouts(sctx, conn, cfg.RuntimeParams)
	cancel()
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("listen: %w", err)
	}
	for _, ch := range channels {
		lctx, cancel := context.WithTimeout(ctx, ListenCheck)
		_, err := conn.Exec(lctx, "LISTEN "+pgx.Identifier{ch}.Sanitize())
		cancel()
		if err != nil {
			_ = conn.Close(context.Background())
			return nil, fmt.Errorf("listen %s: %w", ch, err)
		}
	}
	return conn, nil
}

// waitNotification waits for a notification on conn, checking the
// connection with SELECT 1 whenever check passes without one, and at once
// when the database answers again after an incident (DatabaseAnswered: a
// silent loss may have left conn dead): a connection that does not answer
// within check is an error, and the caller makes a new one.
func (s *Store) waitNotification(ctx context.Context, conn *pgx.Conn, check time.Duration) (*pgconn.Notification, error) {
	for {
		tctx, cancel := context.WithTimeout(ctx, check)
		wctx, stop := untilAnswered(tctx, s.answered.round())
		n, err := conn.WaitForNotification(wctx)
		answered := context.Cause(wctx) == errAnswered
		stop()
		cancel()
		if err == nil {
			return n, nil
		}
		if ctx.Err() != nil || conn.IsClosed() ||
			!(errors.Is(err, context.DeadlineExceeded) || answered && errors.Is(err, context.Canceled)) {
			return nil, err
		}
		pctx, cancel := context.WithTimeout(ctx, check)
		_, err = conn.Exec(pctx, "SELECT 1")
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("the listening connection did not answer a check within %s: %w", check, err)
		}
	}
}

// DatabaseAnswered tells the store that a statement succeeded after
// statements failed: the database answers again. The listener then tries
// at once rather than after its backoff, gives up a connection attempt
// begun before and makes it again, and checks the connection it listens
// on (see Listen). The engine calls it at the first success of each
// database incident; calling it at other times costs the listener a check
// (SELECT 1) or a new connection attempt.
func (s *Store) DatabaseAnswered() { s.answered.signal() }

// errAnswered is the cause of a listener's wait cut short because the
// database answered again.
var errAnswered = errors.New("given up because the database answered again")

// wake is a signal that any number of waiters see: each takes the current
// round, whose context the next signal cancels.
type wake struct {
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
}

func newWake() *wake {
	w := &wake{}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	return w
}

// round returns a context that the next signal cancels.
func (w *wake) round() context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ctx
}

// signal cancels the current round and starts the next.
func (w *wake) signal() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancel()
	w.ctx, w.cancel = context.WithCancel(context.Background())
}

// untilAnswered returns ctx, cancelled also, with the cause errAnswered,
// when round is; stop releases it.
func untilAnswered(ctx, round context.Context) (context.Context, func()) {
	c, cancel := context.WithCancelCause(ctx)
	unhook := context.AfterFunc(round, func() { cancel(errAnswered) })
	return c, func() {
		unhook()
		cancel(nil)
	}
}
