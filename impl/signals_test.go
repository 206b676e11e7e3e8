package impl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// collectParams are the params of test.collect.
type collectParams struct {
	Topic string `json:"topic"`
	// N is how many messages the task collects before it succeeds.
	N int `json:"n"`
	// FailFirst fails the first attempt, retryably, once it received a
	// message and before any checkpoint.
	FailFirst bool `json:"fail_first,omitempty"`
	// One receives at most one message a run, so that messages that came
	// before a run's sleep wait for the next run.
	One bool `json:"one,omitempty"`
	// NoLimit sleeps with a longest wait of zero: without limit.
	NoLimit bool `json:"no_limit,omitempty"`
	// RolledBack checkpoints what it received in a transaction that it
	// rolls back, then succeeds with what it received.
	RolledBack bool `json:"rolled_back,omitempty"`
}

var collectKind = api.Kind[collectParams, []json.RawMessage]{ID: "test.collect"}

// collect is test.collect: it receives the messages of its topic,
// checkpoints those it collected (which consumes them) and sleeps until
// the next one comes, until it has N; its result is their payloads in the
// order received.
type collect struct{ pool *pgxpool.Pool }

func (collect) Kind() api.Kind[collectParams, []json.RawMessage] { return collectKind }
func (collect) TaskID(ids spi.IDs, _ collectParams) api.TaskID   { return ids.Unique() }
func (collect) Policy() spi.Policy {
	return spi.Policy{BackoffMin: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}
}
func (c collect) Run(ctx context.Context, rc spi.RunContext, p collectParams) ([]json.RawMessage, error) {
	var got []json.RawMessage
	if _, err := rc.Progress(&got); err != nil {
		return nil, err
	}
	received := false
	for len(got) < p.N {
		sg, ok, err := rc.Receive(ctx, p.Topic)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		got, received = append(got, sg.Payload), true
		if p.FailFirst && rc.Attempt() == 1 {
			return nil, api.Retryable("once", "the first attempt fails after it received")
		}
		if p.One {
			break
		}
	}
	if p.RolledBack {
		tx, err := c.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if err := rc.CheckpointTx(ctx, tx, got); err != nil {
			return nil, err
		}
		if err := tx.Rollback(ctx); err != nil {
			return nil, err
		}
	}
	if len(got) >= p.N {
		return got, nil
	}
	if received {
		if err := rc.Checkpoint(ctx, got); err != nil {
			return nil, err
		}
	}
	if p.NoLimit {
		return nil, spi.WaitForSignal(p.Topic, 0)
	}
	return nil, spi.WaitForSignal(p.Topic, time.Hour)
}

// awaitSleep waits until task id sleeps on topic, as Get shows it.
func awaitSleep(t *testing.T, c api.Tasks, id api.TaskID, topic string) {
	t.Helper()
	waitFor(t, time.Minute, "the task to sleep on "+topic, func() bool {
		got, err := c.Get(context.Background(), id)
		require.NoError(t, err)
		return got.Waiting != nil && got.Waiting.Reason == api.WaitSignal
	})
	got, err := c.Get(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, got.Status)
	require.Equal(t, topic, got.Waiting.Key)
	require.Equal(t, "signal "+topic, got.Waiting.Detail)
}

// collectAsleep starts a server and submits a test.collect of one message on
// topic, which the returned client sees asleep.
func collectAsleep(t *testing.T, topic string) (*env, *impl.Server, *impl.Client, *api.Future[[]json.RawMessage]) {
	t.Helper()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	c := e.client()
	f, err := api.Submit(e.ctx, srv, collectKind, collectParams{Topic: topic, N: 1})
	require.NoError(t, err)
	awaitSleep(t, c, f.ID(), topic)
	return e, srv, c, f
}

// TestSignalWakesASleepingTask: a run that sleeps on a topic holds no
// worker and is woken by the signal's transaction, from another process,
// long before its longest wait; it receives the payload.
func TestSignalWakesASleepingTask(t *testing.T) {
	t.Parallel()
	e, srv, c, f := collectAsleep(t, "paid")
	require.Equal(t, 0, srv.Running(), "a sleeping task holds no worker")

	require.NoError(t, c.Signal(e.ctx, f.ID(), "paid", map[string]int{"amount": 42}))
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	res, err := f.Await(ctx)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.JSONEq(t, `{"amount":42}`, string(res[0]))
	require.Zero(t, e.count(`SELECT count(*) FROM stint_signal`), "the finish consumed the message, which had no key: deleted")
}

// TestAConsumedMessageIsKeptOnlyForItsKey: a consumed message without an
// idempotency key is deleted with its consumption; one with a key is
// kept, marked consumed, so that its key stores nothing again.
func TestAConsumedMessageIsKeptOnlyForItsKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	c := e.client()
	f, err := api.Submit(e.ctx, srv, collectKind, collectParams{Topic: "two", N: 2})
	require.NoError(t, err)
	require.NoError(t, c.Signal(e.ctx, f.ID(), "two", "keyed", api.SignalKey("k-1")))
	require.NoError(t, c.Signal(e.ctx, f.ID(), "two", "bare"))
	res, err := f.Await(e.ctx)
	require.NoError(t, err)
	require.Len(t, res, 2)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_signal WHERE task_id = $1`, string(f.ID())), "the keyed message alone is kept")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_signal WHERE task_id = $1 AND key = 'k-1' AND consumed_at IS NOT NULL`, string(f.ID())))
}

// TestSignalsAreReceivedInOrderOnce: messages sent while the task runs,
// sleeps and wakes, each sent twice under its idempotency key, are
// received once each, in the order sent, with no wake lost: a lost one
// would leave the task asleep for its hour. A run that takes one message
// sleeps with others waiting, and is due again at once.
func TestSignalsAreReceivedInOrderOnce(t *testing.T) {
	t.Parallel()
	for _, one := range []bool{false, true} {
		t.Run(fmt.Sprintf("one=%v", one), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			srv := e.server("n1", 5*time.Second)
			c := e.client()
			const n = 60
			// The task ends with the last message, n, sent once the
			// others are: a second signal of a key, or one of the other
			// topic, after it would find the task finished.
			f, err := api.Submit(e.ctx, srv, collectKind, collectParams{Topic: "tick", N: n + 1, One: one})
			require.NoError(t, err)
			for i := range n {
				key := api.SignalKey(fmt.Sprintf("k%d", i))
				require.NoError(t, c.Signal(e.ctx, f.ID(), "tick", i, key))
				require.NoError(t, srv.Signal(e.ctx, f.ID(), "tick", i, key), "a second signal of the key stores nothing")
				require.NoError(t, c.Signal(e.ctx, f.ID(), "other", i), "another topic wakes nothing")
			}
			require.NoError(t, c.Signal(e.ctx, f.ID(), "tick", n))
			ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
			defer cancel()
			res, err := f.Await(ctx)
			require.NoError(t, err)
			require.Len(t, res, n+1)
			for i, raw := range res {
				require.Equal(t, fmt.Sprint(i), string(raw))
			}
			got, err := c.Get(e.ctx, f.ID())
			require.NoError(t, err)
			require.Len(t, got.Signals, n, "the other topic's messages wait unconsumed")
			for _, sg := range got.Signals {
				require.Equal(t, "other", sg.Topic)
			}
		})
	}
}

// TestSignalWaitWithoutLimit: a sleep with a longest wait of zero waits
// without limit, rather than running again at once.
func TestSignalWaitWithoutLimit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	c := e.client()
	f, err := api.Submit(e.ctx, srv, collectKind, collectParams{Topic: "later", N: 1, NoLimit: true})
	require.NoError(t, err)
	awaitSleep(t, c, f.ID(), "later")
	got, err := c.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Greater(t, time.Until(*got.ScheduleNotBefore), 50*365*24*time.Hour)
	require.NoError(t, c.Signal(e.ctx, f.ID(), "later", true))
	res, err := f.Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, []json.RawMessage{json.RawMessage(`true`)}, res)
}

// TestSignalCheckpointRolledBack: messages whose CheckpointTx rolled back
// are consumed by the run's finish, not left behind on a finished task.
func TestSignalCheckpointRolledBack(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	f, err := api.Submit(e.ctx, c, collectKind, collectParams{Topic: "once", N: 1, RolledBack: true})
	require.NoError(t, err)
	require.NoError(t, c.Signal(e.ctx, f.ID(), "once", 1))
	e.server("n1", 5*time.Second)
	res, err := f.Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, []json.RawMessage{json.RawMessage(`1`)}, res)
	require.Zero(t, e.count(`SELECT count(*) FROM stint_signal WHERE consumed_at IS NULL`))
}

// TestSignalBeforeTheRunWaitsForIt: a message sent before the task's
// first run is received by it; a failed run consumes nothing, so its
// retry receives the same message.
func TestSignalBeforeTheRunWaitsForIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	f, err := api.Submit(e.ctx, c, collectKind, collectParams{Topic: "go", N: 1, FailFirst: true})
	require.NoError(t, err)
	require.NoError(t, c.Signal(e.ctx, f.ID(), "go", "now"))
	got, err := c.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Len(t, got.Signals, 1)
	require.Equal(t, "go", got.Signals[0].Topic)
	require.JSONEq(t, `"now"`, string(got.Signals[0].Payload))

	e.server("n1", 5*time.Second)
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	res, err := f.Await(ctx)
	require.NoError(t, err)
	require.Equal(t, []json.RawMessage{json.RawMessage(`"now"`)}, res)
	got, err = c.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, 2, got.Attempt, "the first run failed after it received")
	require.Empty(t, got.Signals)
}

// TestSignalInTheCallersTransaction: a signal sent in a transaction that
// rolls back stores nothing and wakes nothing; one that commits wakes the
// task.
func TestSignalInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	e, _, c, f := collectAsleep(t, "approval")

	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	require.NoError(t, c.SignalTx(e.ctx, tx, f.ID(), "approval", "no"))
	require.NoError(t, tx.Rollback(e.ctx))
	awaitSleep(t, c, f.ID(), "approval")
	require.Zero(t, e.count(`SELECT count(*) FROM stint_signal`))

	require.NoError(t, pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		return c.SignalTx(e.ctx, tx, f.ID(), "approval", "yes")
	}))
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	res, err := f.Await(ctx)
	require.NoError(t, err)
	require.Equal(t, []json.RawMessage{json.RawMessage(`"yes"`)}, res)
}

// TestSignalRefusesBadInput: a signal to no task, to a finished task, or
// with a bad topic, key or payload is refused whole, storing nothing.
func TestSignalRefusesBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	c := e.client()
	done, err := api.Submit(e.ctx, srv, collectKind, collectParams{Topic: "x", N: 0})
	require.NoError(t, err)
	_, err = done.Await(e.ctx)
	require.NoError(t, err)
	open, err := api.Submit(e.ctx, c, collectKind, collectParams{Topic: "x", N: 1, FailFirst: true})
	require.NoError(t, err)
	wf, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-signals", Nodes: []api.WorkflowNode{signalGate("g", "x", time.Hour)}})
	require.NoError(t, err)

	var wg sync.WaitGroup
	for _, tc := range []struct {
		name    string
		id      api.TaskID
		topic   string
		payload any
		opts    []api.SignalOption
		want    error
	}{
		{"no such task", "nope", "x", 1, nil, api.ErrNotFound},
		{"finished task", done.ID(), "x", 1, nil, api.ErrConflict},
		{"a workflow's own task", wf.ID, "x", 1, nil, api.ErrConflict},
		{"bad id", "", "x", 1, nil, api.ErrInvalid},
		{"empty topic", open.ID(), "", 1, nil, api.ErrInvalid},
		{"topic with a space", open.ID(), "a b", 1, nil, api.ErrInvalid},
		{"long topic", open.ID(), strings.Repeat("t", 129), 1, nil, api.ErrInvalid},
		{"bad key", open.ID(), "x", 1, []api.SignalOption{api.SignalKey("k k")}, api.ErrInvalid},
		{"payload not JSON", open.ID(), "x", json.RawMessage(`{"a":`), nil, api.ErrInvalid},
		{"payload PostgreSQL refuses", open.ID(), "x", json.RawMessage(`"\u0000"`), nil, api.ErrInvalid},
		{"payload too big", open.ID(), "x", strings.Repeat("p", api.MaxSignalBytes), nil, api.ErrInvalid},
	} {
		wg.Go(func() {
			err := c.Signal(e.ctx, tc.id, tc.topic, tc.payload, tc.opts...)
			require.ErrorIs(t, err, tc.want, tc.name)
		})
	}
	wg.Wait()
	require.Zero(t, e.count(`SELECT count(*) FROM stint_signal`))
}
