package impl

// Concurrent Signals share statements: each Signal outside a caller's
// transaction joins a batch, and a batch goes out as one round trip and
// one commit.

import (
	"context"
	"errors"
	"fmt"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// The Signals of a Client share batches (Client.signals, a batchQueue)
// without a key:
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
func (c *Client) signalBatches() batchKind[*coalescedSignal] {
	return batchKind[*coalescedSignal]{send: c.sendSignals, maxEntries: maxCoalesced}
}

// coalescedSignal is one Signal in a batch.
type coalescedSignal struct {
	queued
	sg  store.NewSignal
	err error
	// done is closed once err is the signal's outcome.
	done chan struct{}
}

// signalCoalesced stores sg in a batch with the concurrent Signals of c;
// see signalBatches.
func (c *Client) signalCoalesced(ctx context.Context, sg store.NewSignal) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("signal task %s: %w", sg.ID, err)
	}
	e := &coalescedSignal{sg: sg, done: make(chan struct{})}
	if !c.signals.do(ctx, e) {
		return fmt.Errorf("signal task %s: not sent: %w", sg.ID, ctx.Err())
	}
	<-e.done
	return e.err
}

// sendSignals stores a batch's signals and gives each its outcome, those
// of tasks whose rows were busy later (see storeBusy).
func (c *Client) sendSignals(ctx context.Context, entries []*coalescedSignal) {
	for _, busy := range c.storeSignals(ctx, entries, nil) {
		go c.storeBusy(context.WithoutCancel(busy[0].ctx), busy)
	}
}

// storeSignals stores entries in one round trip, or, when the database
// refuses the statement for a row, in halves; see signalBatches. It
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
