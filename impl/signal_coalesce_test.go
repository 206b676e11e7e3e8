package impl_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// gatedSignals records the signal statements sent through a store (the
// messages of each) and holds the first until hold is closed.
type gatedSignals struct {
	*postgres.Store
	mu    sync.Mutex
	calls []int
	hold  chan struct{}
	held  chan struct{} // closed once the first call waits
}

func (g *gatedSignals) Signal(ctx context.Context, tx pgx.Tx, sigs []store.NewSignal, opts store.SignalOptions) ([]error, bool, error) {
	g.mu.Lock()
	first := len(g.calls) == 0
	g.calls = append(g.calls, len(sigs))
	g.mu.Unlock()
	if first {
		close(g.held)
		<-g.hold
	}
	return g.Store.Signal(ctx, tx, sigs, opts)
}

// record returns the messages of each signal call so far.
func (g *gatedSignals) record() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.calls...)
}

// signalsClient returns a client on a store of e's whose signal
// statements g records; the first is held until g.hold is closed.
func (e *env) signalsClient() (*impl.Client, *gatedSignals) {
	e.t.Helper()
	g := &gatedSignals{Store: e.st, hold: make(chan struct{}), held: make(chan struct{})}
	c, err := impl.NewClient(g, impl.ClientConfig{Registry: testRegistry(e.pool, "client", time.Second), PollInterval: 100 * time.Millisecond})
	require.NoError(e.t, err)
	e.t.Cleanup(c.Close)
	return c, g
}

// signalAsync sends a signal through c in a goroutine and returns where
// its error arrives.
func signalAsync(ctx context.Context, c api.Signals, id api.TaskID, topic string, payload any, opts ...api.SignalOption) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- c.Signal(ctx, id, topic, payload, opts...) }()
	return ch
}

// finishedCollect submits a test.collect that succeeds at once and
// returns its id once it has.
func finishedCollect(t *testing.T, e *env, c api.Tasks) api.TaskID {
	t.Helper()
	f, err := api.Submit(e.ctx, c, collectKind, collectParams{Topic: "x", N: 0})
	require.NoError(t, err)
	_, err = f.Await(e.ctx)
	require.NoError(t, err)
	return f.ID()
}

// TestConcurrentSignalsShareOneStatement: the signals that arrive while
// one is in the database go out together, in one statement, once it
// returns. Each caller gets its own outcome: the signal to a missing task
// ErrNotFound, the one to a finished task ErrConflict, and the others of
// the batch are stored all the same; of two with one key, the first is
// stored. Bad input never joins the batch and stores nothing.
func TestConcurrentSignalsShareOneStatement(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	done := finishedCollect(t, e, srv)
	var open [2]api.TaskID
	for i := range open {
		f, err := api.Submit(e.ctx, srv, collectKind, collectParams{Topic: "x", N: 100})
		require.NoError(t, err)
		open[i] = f.ID()
		awaitSleep(t, srv, f.ID(), "x")
	}
	c, g := e.signalsClient()
	// On a topic the task does not sleep on: a run it woke could hold the
	// task's row as the batch goes out, which would then pass over it.
	first := signalAsync(e.ctx, c, open[0], "y", "first")
	select {
	case <-g.held:
	case <-time.After(20 * time.Second):
		t.Fatal("the first signal never reached the store")
	}

	// Each joins the batch after the one before, so that the batch's
	// order is known.
	type sent struct {
		name string
		out  <-chan error
		want error
	}
	var batch []sent
	for _, s := range []struct {
		name    string
		id      api.TaskID
		payload any
		key     string
		want    error
	}{
		{"no such task", "nope", 1, "", api.ErrNotFound},
		{"the first of a key", open[0], "dup-1", "dup", nil},
		{"a finished task", done, 2, "", api.ErrConflict},
		{"the second of a key", open[0], "dup-2", "dup", nil},
		{"another task", open[1], "b", "", nil},
	} {
		var opts []api.SignalOption
		if s.key != "" {
			opts = append(opts, api.SignalKey(s.key))
		}
		batch = append(batch, sent{s.name, signalAsync(e.ctx, c, s.id, "x", s.payload, opts...), s.want})
		waitFor(t, 20*time.Second, s.name+" to wait in the batch", func() bool { return impl.SignalsWaiting(c) == len(batch) })
	}
	require.ErrorIs(t, c.Signal(e.ctx, open[1], "a b", 1), api.ErrInvalid, "bad input is refused before it joins")
	require.Equal(t, len(batch), impl.SignalsWaiting(c))

	close(g.hold)
	require.NoError(t, <-first)
	for _, s := range batch {
		err := <-s.out
		if s.want == nil {
			require.NoError(t, err, s.name)
		} else {
			require.ErrorIs(t, err, s.want, s.name)
		}
	}
	require.Equal(t, []int{1, len(batch)}, g.record(), "the signals that waited went out in one statement")
	payloads := func(id api.TaskID) []string {
		rows, err := e.pool.Query(e.ctx, `SELECT payload::text FROM stint_signal WHERE task_id = $1 ORDER BY seq`, id)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return got
	}
	require.Equal(t, []string{`"first"`, `"dup-1"`}, payloads(open[0]), "the first of a key is stored, in the batch's order")
	require.Equal(t, []string{`"b"`}, payloads(open[1]))
	require.Empty(t, payloads(done))
}

// TestManySendersSignalManyTasks: goroutines that each send messages to
// many tasks at once share statements, and every task receives every
// message once, each sender's in the order it sent them.
func TestManySendersSignalManyTasks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	c, g := e.signalsClient()
	close(g.hold)
	const tasks, senders, each = 16, 8, 6
	futures := make([]*api.Future[[]json.RawMessage], tasks)
	for i := range futures {
		f, err := api.Submit(e.ctx, srv, collectKind, collectParams{Topic: "tick", N: senders * each})
		require.NoError(t, err)
		futures[i] = f
	}
	for _, f := range futures {
		awaitSleep(t, srv, f.ID(), "tick")
	}
	type msg struct{ S, I int }
	var wg sync.WaitGroup
	errs := make([]error, senders)
	for s := range senders {
		wg.Go(func() {
			for i := 0; i < each && errs[s] == nil; i++ {
				for k := range futures {
					// Each sender goes through the tasks in its own order.
					f := futures[(k+s)%tasks]
					if errs[s] = c.Signal(e.ctx, f.ID(), "tick", msg{s, i}); errs[s] != nil {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	for _, f := range futures {
		res, err := f.Await(ctx)
		require.NoError(t, err)
		require.Len(t, res, senders*each)
		next := make([]int, senders)
		for _, raw := range res {
			var m msg
			require.NoError(t, json.Unmarshal(raw, &m))
			require.Equal(t, next[m.S], m.I, "sender %d's messages to %s in the order sent, each once", m.S, f.ID())
			next[m.S]++
		}
	}
	require.Zero(t, e.count(`SELECT count(*) FROM stint_signal WHERE consumed_at IS NULL`))
	calls := g.record()
	require.Less(t, len(calls), tasks*senders*each, "concurrent signals shared statements")
	t.Logf("%d signals in %d statements", tasks*senders*each, len(calls))
}

// TestSignalManyIsAllOrNothing: SignalMany stores every message in one
// statement, in order, the first of a key alone, and wakes the task; a
// request refused, by its input or its task, stores none.
func TestSignalManyIsAllOrNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	c := e.client()
	done := finishedCollect(t, e, srv)
	f, err := api.Submit(e.ctx, srv, collectKind, collectParams{Topic: "x", N: 3})
	require.NoError(t, err)
	awaitSleep(t, c, f.ID(), "x")

	req := func(id api.TaskID, topic string, payload any, key string) api.SignalRequest {
		return api.SignalRequest{ID: id, Topic: topic, Payload: payload, Key: key}
	}
	for _, tc := range []struct {
		name string
		reqs []api.SignalRequest
		want error
	}{
		{"no such task", []api.SignalRequest{req(f.ID(), "x", 1, ""), req("nope", "x", 2, "")}, api.ErrNotFound},
		{"a finished task", []api.SignalRequest{req(f.ID(), "x", 1, ""), req(done, "x", 2, "")}, api.ErrConflict},
		{"a bad topic", []api.SignalRequest{req(f.ID(), "x", 1, ""), req(f.ID(), "a b", 2, "")}, api.ErrInvalid},
		{"a bad key", []api.SignalRequest{req(f.ID(), "x", 1, ""), req(f.ID(), "x", 2, "k k")}, api.ErrInvalid},
		{"a bad payload", []api.SignalRequest{req(f.ID(), "x", 1, ""), req(f.ID(), "x", json.RawMessage(`{`), "")}, api.ErrInvalid},
	} {
		err := c.SignalMany(e.ctx, tc.reqs)
		require.ErrorIs(t, err, tc.want, tc.name)
		require.ErrorContains(t, err, "request 1", tc.name)
	}
	require.Zero(t, e.count(`SELECT count(*) FROM stint_signal`), "a refused call stores nothing")
	awaitSleep(t, c, f.ID(), "x")
	require.NoError(t, c.SignalMany(e.ctx, nil))

	require.NoError(t, c.SignalMany(e.ctx, []api.SignalRequest{
		req(f.ID(), "x", 1, "k"), req(f.ID(), "x", 2, "k"), req(f.ID(), "x", 3, ""), req(f.ID(), "x", 4, ""),
	}))
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	res, err := f.Await(ctx)
	require.NoError(t, err)
	require.Equal(t, []json.RawMessage{json.RawMessage(`1`), json.RawMessage(`3`), json.RawMessage(`4`)}, res)
}
