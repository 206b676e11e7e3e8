package impl

// Concurrent single submits share statements: each Submit outside a
// caller's transaction joins a batch, and a batch goes out as one submit
// statement and one commit.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// maxCoalesced is the most submits one batch holds. A full batch goes out
// at once, even while another is in the database.
const maxCoalesced = 1000

// coalescer gathers the single submits of a Client into batches. The rules:
//
//   - A batch goes out when no batch is in the database (a lone submit
//     goes out at once, alone, as it would without coalescing), or when
//     it is full; the others wait for the batches in the database to
//     return. No timer delays a batch.
//   - A batch never holds an id twice: a submit whose id is in the open
//     batch joins a later one, which goes out after it, so that its
//     dedup is that of two submits one after the other. Within a batch
//     the tasks go out in id order, so that two batches in the database
//     at once lock their rows in the same order.
//   - Each submit's own checks (validation, rate limits) run before it
//     joins: a refused submit never reaches a batch.
//   - A batch the database refuses for one of its rows (an error of the
//     statement, not of the database's availability) is split in halves,
//     each sent on its own, down to single submits: the others are stored
//     and only the failing row's submit gets the error.
//   - A submit learns its outcome once its batch's statement has
//     committed, or failed.
//   - A caller whose context ends before its batch goes out is dropped
//     from it and gets ctx's error: its task is not stored. Once its
//     batch is in the database it waits for the batch's outcome and gets
//     that: an error wrapping ctx's error always means that nothing was
//     stored.
type coalescer struct {
	mu sync.Mutex
	// queue holds the batches not sent yet, the next to go first.
	queue []*submitBatch
	// inFlight counts the batches in the database.
	inFlight int
}

// submitBatch is a batch of single submits.
type submitBatch struct {
	entries []*coalesced
	// ids holds the ids of entries without new ids (store.NewTask.Unique),
	// made on the first.
	ids  map[api.TaskID]struct{}
	sent bool
	// done is closed once every entry has its outcome.
	done chan struct{}
}

// coalesced is one submit in a batch.
type coalesced struct {
	ctx  context.Context // the caller's, for its values (the trace)
	task store.NewTask
	gone bool // the caller gave up before the batch went out
	sub  api.Submission
	err  error
}

// join adds e to the first batch of the queue that may take it, or to a
// new one at the end. q.mu is held.
func (q *coalescer) join(e *coalesced) *submitBatch {
	for _, b := range q.queue {
		if len(b.entries) >= maxCoalesced {
			continue
		}
		if !e.task.Unique {
			if _, dup := b.ids[e.task.ID]; dup {
				continue
			}
		}
		b.add(e)
		return b
	}
	b := &submitBatch{done: make(chan struct{})}
	b.add(e)
	q.queue = append(q.queue, b)
	return b
}

// add appends e to b.
func (b *submitBatch) add(e *coalesced) {
	b.entries = append(b.entries, e)
	if !e.task.Unique {
		if b.ids == nil {
			b.ids = map[api.TaskID]struct{}{}
		}
		b.ids[e.task.ID] = struct{}{}
	}
}

// take removes the batches that go out now from the queue, marks them
// sent and counts them in flight: the first when none is in flight, and
// full ones. Entries whose callers gave up are left out. q.mu is held.
func (q *coalescer) take() []*submitBatch {
	var out []*submitBatch
	for len(q.queue) > 0 && (q.inFlight == 0 || len(q.queue[0].entries) >= maxCoalesced) {
		b := q.queue[0]
		q.queue[0] = nil
		q.queue = q.queue[1:]
		b.sent = true
		b.entries = slices.DeleteFunc(b.entries, func(e *coalesced) bool { return e.gone })
		q.inFlight++
		out = append(out, b)
	}
	return out
}

// submitCoalesced stores t, due to no Combiner, in a batch with the
// concurrent single submits of c; see coalescer.
func (c *Client) submitCoalesced(ctx context.Context, t store.NewTask) (api.Submission, error) {
	if err := ctx.Err(); err != nil {
		return api.Submission{}, fmt.Errorf("submit %s: %w", t.Behavior, err)
	}
	q := &c.coalesce
	e := &coalesced{ctx: ctx, task: t}
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
			go c.sendBatch(s)
		}
	}
	if own {
		c.sendBatch(b)
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		q.mu.Lock()
		if !b.sent {
			e.gone = true
			q.mu.Unlock()
			return api.Submission{}, fmt.Errorf("submit %s: not sent: %w", t.Behavior, ctx.Err())
		}
		q.mu.Unlock()
		<-b.done
	}
	return e.sub, e.err
}

// sendBatch stores b's entries, gives each its outcome, and sends the
// batches that may go out now that b returned, each in a goroutine.
func (c *Client) sendBatch(b *submitBatch) {
	if len(b.entries) > 0 {
		// The batch outlives any one caller's context, and carries the
		// first one's values.
		c.storeCoalesced(context.WithoutCancel(b.entries[0].ctx), b.entries)
	}
	close(b.done)
	q := &c.coalesce
	q.mu.Lock()
	q.inFlight--
	next := q.take()
	q.mu.Unlock()
	for _, s := range next {
		go c.sendBatch(s)
	}
}

// storeCoalesced stores entries in one statement, or, when the database
// refuses it for a row, in halves; see coalescer.
func (c *Client) storeCoalesced(ctx context.Context, entries []*coalesced) {
	if slices.ContainsFunc(entries, func(e *coalesced) bool { return !e.task.Unique }) {
		slices.SortFunc(entries, func(a, b *coalesced) int { return strings.Compare(string(a.task.ID), string(b.task.ID)) })
	}
	tasks := make([]store.NewTask, len(entries))
	for i, e := range entries {
		tasks[i] = e.task
	}
	subs, led, due, err := c.storePlain(ctx, nil, tasks, false)
	switch {
	case err == nil:
		for i, e := range entries {
			e.sub = subs[i]
		}
		c.countSubmitted(ctx, tasks)
		c.kick.stored(due, led, earliestDelay(tasks))
	case len(entries) > 1 && rowRefused(err):
		half := len(entries) / 2
		c.storeCoalesced(ctx, entries[:half])
		c.storeCoalesced(ctx, entries[half:])
	default:
		for _, e := range entries {
			e.err = err
		}
	}
}

// rowRefused reports whether err is the database refusing a statement for
// what it holds (a constraint, a trigger, a deadlock), which another
// statement without some of its rows may not meet, rather than the
// database failing to serve it.
func rowRefused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && classify(err) == ""
}
