package impl

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/sqltx"
	"github.com/stinthq/stint/spi"
)

// Signal sends a message to a task; see api.Signals.
func (c *Client) Signal(ctx context.Context, id api.TaskID, topic string, payload any, opts ...api.SignalOption) error {
	return c.signal(ctx, nil, id, topic, payload, opts)
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

// signal checks a signal whole before it stores it, in tx when not nil.
func (c *Client) signal(ctx context.Context, tx pgx.Tx, id api.TaskID, topic string, payload any, opts []api.SignalOption) error {
	var o api.SignalOptions
	for _, opt := range opts {
		opt(&o)
	}
	err := spi.CheckTaskID("id", id)
	if err == nil {
		err = checkName("topic", topic)
	}
	if err == nil && o.Key != "" {
		err = checkName("key", o.Key)
	}
	if err != nil {
		return fmt.Errorf("signal task %s: %w", id, err)
	}
	raw, err := encodeValue("payload", payload, api.MaxSignalBytes)
	if err != nil {
		return fmt.Errorf("signal task %s: %w", id, err)
	}
	if _, err := c.st.Signal(ctx, tx, id, topic, raw, o.Key); err != nil {
		return unavailable(err)
	}
	return nil
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
