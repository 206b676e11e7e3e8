package impl

// Concurrent Signals share statements: each Signal outside a caller's
// transaction joins a batch, and a batch goes out as one round trip and
// one commit.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// signalCoalescer gathers the Signals of a Client into batches, by the
// rules of the submits' coalescer (see coalescer), with these
// differences:
//
//   - A batch may hold several signals of one task, and of one key: the
//     statement stores a task's messages in the order they joined the
//     batch, and of two with one key the first (see store.Store.Signal).
//     A goroutine's Signals return one after the other, so each goes
//     out after the last one's was stored, and its messages to a task are
//     stored in the order it sent them.
//   - The statement decides each signal on its own: a missing task
//     (api.ErrNotFound) or a finished one (api.ErrConflict) refuses its
//     signals and stores the others of the batch. Only an error of the
//     statement (a row the database refuses) splits the batch in halves,
//     each sent on its own, down to single signals, so that only the
//     failing signal's caller gets the error.
//   - The statement waits for no task's row (store.SignalPass): a batch
//     that waited for one row while it held others could deadlock with a
//     finish that locks the same tasks in another order, and would hold
//     up the batches behind it while the row's holder (a run's claim,
//     checkpoint or finish) went on. The signals of a task whose row
//     another transaction held are stored once the batch returned, a
//     task at a time, each in a transaction of its own that waits for the
//     row and holds no other, beside the batches that go out next. Their
//     callers wait for them; since none of them returned, none sent a
//     later message that could overtake them.
type signalCoalescer struct {
	mu sync.Mutex
	// queue holds the batches not sent yet, the next to go first.
	queue []*signalBatch
	// inFlight counts the batches in the database.
	inFlight int
}

// signalBatch is a batch of Signals.
type signalBatch struct {
	entries []*coalescedSignal
	sent    bool
}

// coalescedSignal is one Signal in a batch.
type coalescedSignal struct {
	ctx  context.Context // the caller's, for its values
	sg   store.NewSignal
	gone bool // the caller gave up before the batch went out
	err  error
	// done is closed once err is the signal's outcome.
	done chan struct{}
}

// join adds e to the last batch of the queue unless it is full, or to a
// new one at the end. q.mu is held.
func (q *signalCoalescer) join(e *coalescedSignal) *signalBatch {
	if n := len(q.queue); n > 0 && len(q.queue[n-1].entries) < maxCoalesced {
		b := q.queue[n-1]
		b.entries = append(b.entries, e)
		return b
	}
	b := &signalBatch{entries: []*coalescedSignal{e}}
	q.queue = append(q.queue, b)
	return b
}

// take removes the batches that go out now from the queue, marks them
// sent and counts them in flight: the first when none is in flight, and
// full ones. Entries whose callers gave up are left out. q.mu is held.
func (q *signalCoalescer) take() []*signalBatch {
	var out []*signalBatch
	for len(q.queue) > 0 && (q.inFlight == 0 || len(q.queue[0].entries) >= maxCoalesced) {
		b := q.queue[0]
		q.queue[0] = nil
		q.queue = q.queue[1:]
		b.sent = true
		b.entries = slices.DeleteFunc(b.entries, func(e *coalescedSignal) bool { return e.gone })
		q.inFlight++
		out = append(out, b)
	}
	return out
}

// signalCoalesced stores sg in a batch with the concurrent Signals of c;
// see signalCoalescer.
func (c *Client) signalCoalesced(ctx context.Context, sg store.NewSignal) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("signal task %s: %w", sg.ID, err)
	}
	q := &c.signals
	e := &coalescedSignal{ctx: ctx, sg: sg, done: make(chan struct{})}
	q.mu.Lock()
	b := q.join(e)
	send := q.take()
	q.mu.Unlock()
	// The caller sends its own batch; others that go out now (full ones)
	// go side by side.
	own := false
	for _, s := range send {
		if s == b {
			own = true
		} else {
			go c.sendSignals(s)
		}
	}
	if own {
		c.sendSignals(b)
	}
	select {
	case <-e.done:
	case <-ctx.Done():
		q.mu.Lock()
		if !b.sent {
			e.gone = true
			q.mu.Unlock()
			return fmt.Errorf("signal task %s: not sent: %w", sg.ID, ctx.Err())
		}
		q.mu.Unlock()
		<-e.done
	}
	return e.err
}

// sendSignals stores b's entries, gives each its outcome (those of tasks
// whose rows were busy later, see storeBusy), and sends the batches that
// may go out now that b returned, each in a goroutine.
func (c *Client) sendSignals(b *signalBatch) {
	var busy [][]*coalescedSignal
	if len(b.entries) > 0 {
		// The batch outlives any one caller's context, and carries the
		// first one's values.
		busy = c.storeSignals(context.WithoutCancel(b.entries[0].ctx), b.entries, nil)
	}
	q := &c.signals
	q.mu.Lock()
	q.inFlight--
	next := q.take()
	q.mu.Unlock()
	for _, s := range next {
		go c.sendSignals(s)
	}
	for _, entries := range busy {
		go c.storeBusy(context.WithoutCancel(entries[0].ctx), entries)
	}
}

// storeSignals stores entries in one round trip, or, when the database
// refuses the statement for a row, in halves; see signalCoalescer. It
// gives each entry its outcome, except those of tasks whose rows another
// transaction held, which it appends to busy, a slice per task, and
// returns.
func (c *Client) storeSignals(ctx context.Context, entries []*coalescedSignal, busy [][]*coalescedSignal) [][]*coalescedSignal {
	sigs := make([]store.NewSignal, len(entries))
	for i, e := range entries {
		sigs[i] = e.sg
	}
	refused, woke, err := c.st.Signal(ctx, nil, sigs, c.signalOptions(store.SignalPass))
	switch {
	case err == nil:
		c.signalled(woke)
		// The busy tasks' entries, in the batch's order.
		var at map[api.TaskID]int
		for i, e := range entries {
			if refused != nil && errors.Is(refused[i], store.ErrBusy) {
				if at == nil {
					at = map[api.TaskID]int{}
				}
				k, ok := at[e.sg.ID]
				if !ok {
					k = len(busy)
					at[e.sg.ID] = k
					busy = append(busy, nil)
				}
				busy[k] = append(busy[k], e)
				continue
			}
			if refused != nil {
				e.err = refused[i]
			}
			close(e.done)
		}
	case len(entries) > 1 && rowRefused(err):
		half := len(entries) / 2
		busy = c.storeSignals(ctx, entries[:half], busy)
		busy = c.storeSignals(ctx, entries[half:], busy)
	default:
		err = unavailable(err)
		for _, e := range entries {
			e.err = err
			if len(entries) > 1 {
				e.err = fmt.Errorf("signal task %s: %w", e.sg.ID, err)
			}
			close(e.done)
		}
	}
	return busy
}

// storeBusy stores the entries of one task whose row was busy in their
// batch, waiting for the row, and gives each its outcome.
func (c *Client) storeBusy(ctx context.Context, entries []*coalescedSignal) {
	sigs := make([]store.NewSignal, len(entries))
	for i, e := range entries {
		sigs[i] = e.sg
	}
	refused, woke, err := c.st.Signal(ctx, nil, sigs, c.signalOptions(store.SignalWait))
	if err == nil {
		c.signalled(woke)
	} else {
		err = unavailable(err)
	}
	for i, e := range entries {
		switch {
		case err != nil:
			e.err = err
		case refused != nil:
			e.err = refused[i]
		}
		close(e.done)
	}
}
