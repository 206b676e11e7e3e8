package impl

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/sqltx"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// Signal sends a message to a task; see api.Signals. A task that
// finished for good is reopened when its behavior's policy in c's
// Registry has spi.Policy.ReopenOnSignal, and refused with
// api.ErrConflict when c's Registry does not hold the behavior or its
// policy does not; SignalMany, SignalTx and SignalSQLTx follow the same
// rule.
//
// Concurrent Signals of one Client share statements, as concurrent
// Submits do (see Submit and signalBatches): each joins a batch that
// goes out as one round trip and one commit, at once when no batch of
// the Client is in the database (so a lone signal goes out alone, without
// waiting) or when it holds 1,000 signals, and otherwise as soon as the
// batch in the database returns. The batch decides each signal on its
// own, in the statement: a signal to a missing task gets an error
// wrapping api.ErrNotFound, one to a finished task api.ErrConflict, and
// the others in the batch are stored all the same; bad input is refused
// before it joins a batch. A caller gets its outcome once the batch
// committed. If ctx ends before the batch goes out, nothing is stored
// and Signal returns ctx's error; once the batch is in the database,
// Signal waits for its outcome.
func (c *Client) Signal(ctx context.Context, id api.TaskID, topic string, payload any, opts ...api.SignalOption) error {
	var o api.SignalOptions
	for _, opt := range opts {
		opt(&o)
	}
	sg, err := newSignal(id, topic, payload, o.Key)
	if err != nil {
		return fmt.Errorf("signal task %s: %w", id, err)
	}
	return c.signalCoalesced(ctx, sg)
}

// SignalMany sends messages to tasks, all or none, in one round trip;
// see api.Signals.
func (c *Client) SignalMany(ctx context.Context, reqs []api.SignalRequest) error {
	sigs := make([]store.NewSignal, len(reqs))
	for i, req := range reqs {
		sg, err := newSignal(req.ID, req.Topic, req.Payload, req.Key)
		if err != nil {
			return fmt.Errorf("signal many: request %d (task %s): %w", i, req.ID, err)
		}
		sigs[i] = sg
	}
	refused, woke, err := c.st.Signal(ctx, nil, sigs, c.signalOptions(store.SignalAll))
	if err != nil {
		return fmt.Errorf("signal many: %w", unavailable(err))
	}
	for i, err := range refused {
		if err != nil {
			return fmt.Errorf("signal many: request %d: %w", i, err)
		}
	}
	c.signalled(woke)
	return nil
}

// SignalTx is Signal in the caller's transaction tx: the message is
// stored, and a task asleep on the topic due, if and only if tx commits.
// tx must run at READ COMMITTED, PostgreSQL's default, so that its
// statements see a run's sleep that committed while they waited for the
// task's row.
func (c *Client) SignalTx(ctx context.Context, tx pgx.Tx, id api.TaskID, topic string, payload any, opts ...api.SignalOption) error {
	if tx == nil {
		return fmt.Errorf("signal task %s: %w", id, api.Invalid("tx", "is nil"))
	}
	return c.signal(ctx, tx, id, topic, payload, opts)
}

// SignalSQLTx is SignalTx in a transaction begun through database/sql
// with pgx's stdlib driver (see SubmitSQLTx); another driver's gets an
// api.ErrInvalid error and is left as it was.
func (c *Client) SignalSQLTx(ctx context.Context, tx *sql.Tx, id api.TaskID, topic string, payload any, opts ...api.SignalOption) error {
	what := fmt.Sprintf("signal task %s", id)
	if tx == nil {
		return fmt.Errorf("%s: %w", what, api.Invalid("tx", "is nil"))
	}
	ran := false
	err := sqltx.Run(ctx, tx, func(tx pgx.Tx) error {
		ran = true
		return c.signal(ctx, tx, id, topic, payload, opts)
	})
	return sqlTxError(what, ran, err)
}

// signal checks a signal whole before it stores it in tx.
func (c *Client) signal(ctx context.Context, tx pgx.Tx, id api.TaskID, topic string, payload any, opts []api.SignalOption) error {
	var o api.SignalOptions
	for _, opt := range opts {
		opt(&o)
	}
	sg, err := newSignal(id, topic, payload, o.Key)
	if err != nil {
		return fmt.Errorf("signal task %s: %w", id, err)
	}
	refused, _, err := c.st.Signal(ctx, tx, []store.NewSignal{sg}, c.signalOptions(store.SignalWait))
	switch {
	case err != nil:
		return unavailable(err)
	case refused != nil:
		return refused[0]
	}
	return nil
}

// signalOptions returns the options of c's signals that lock their tasks
// by lock: the behaviors of c's Registry whose policy has ReopenOnSignal
// reopen their finished tasks.
func (c *Client) signalOptions(lock store.SignalLock) store.SignalOptions {
	o := store.SignalOptions{Lock: lock}
	for _, id := range c.reg.IDs() {
		if reg, ok := c.reg.Lookup(id); ok && reg.Policy.ReopenOnSignal && id != api.WorkflowBehavior {
			o.Reopen = append(o.Reopen, id)
		}
	}
	return o
}

// newSignal checks a signal's id, topic, payload and key, and returns it
// to store.
func newSignal(id api.TaskID, topic string, payload any, key string) (store.NewSignal, error) {
	err := spi.CheckTaskID("id", id)
	if err == nil {
		err = checkName("topic", topic)
	}
	if err == nil && key != "" {
		err = checkName("key", key)
	}
	if err != nil {
		return store.NewSignal{}, err
	}
	raw, err := encodeValue("payload", payload, api.MaxSignalBytes)
	if err != nil {
		return store.NewSignal{}, err
	}
	return store.NewSignal{ID: id, Topic: topic, Payload: raw, Key: key}, nil
}

// signalled follows signals stored outside a caller's transaction: when
// they made a task due now, it wakes this process's own claimers, if it
// is a server, at once rather than when the statement's notification
// comes back from the database.
func (c *Client) signalled(woke bool) {
	if woke {
		c.kick.wakeLocal()
	}
}

// Receive returns the oldest message of topic this run has not received;
// see spi.RunContext.
func (rc *runContext) Receive(ctx context.Context, topic string) (api.Signal, bool, error) {
	id := rc.r.claimed.ID
	if err := checkName("topic", topic); err != nil {
		return api.Signal{}, false, fmt.Errorf("receive on task %s: %w", id, err)
	}
	rc.s.mu.Lock()
	after := rc.r.lastSeq[topic]
	rc.s.mu.Unlock()
	sg, ok, err := rc.s.st.Receive(ctx, id, topic, after)
	if err != nil || !ok {
		return api.Signal{}, false, err
	}
	rc.s.mu.Lock()
	if rc.r.lastSeq == nil {
		rc.r.lastSeq = make(map[string]int64)
	}
	// Two receives of one topic at once may read the same message: the
	// second that returns gives none rather than a message twice.
	if sg.Seq <= rc.r.lastSeq[topic] {
		rc.s.mu.Unlock()
		return api.Signal{}, false, nil
	}
	rc.r.lastSeq[topic] = sg.Seq
	rc.r.received = append(rc.r.received, sg.Seq)
	rc.s.mu.Unlock()
	return sg, true, nil
}

// unconsumed returns the messages the run received that a checkpoint has
// not consumed yet.
func (r *run) unconsumed(s *Server) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), r.received...)
}

// consumed drops the first n of the run's received messages, which a
// checkpoint consumed.
func (r *run) consumed(s *Server, n int) {
	s.mu.Lock()
	r.received = r.received[n:]
	s.mu.Unlock()
}
