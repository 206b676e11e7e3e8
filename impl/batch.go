package impl

import (
	"context"
	"slices"
	"sync"

	"github.com/stinthq/stint/api"
)

// batchQueue gathers the concurrent calls of one kind of a Client (single
// submits, workflow submits, signals) into batches that each go to the
// database as one statement and one commit. A batch goes out when none of
// the queue is in the database (so a lone call goes at once, alone) or
// when it is full; the others wait for those in the database to return,
// and no timer delays one. A call joins the first unsent batch that takes
// it (not full, and without its key: see batchKind.key). A caller whose
// context ends before its batch goes out is dropped from it and its call
// stores nothing; once the batch is sent, it waits for its outcome.
type batchQueue[E batched] struct {
	kind batchKind[E]

	mu sync.Mutex
	// queue holds the batches not sent yet, the next to go first.
	queue []*batch[E]
	// inFlight counts the batches in the database.
	inFlight int
}

// batchKind says what a batchQueue batches.
type batchKind[E batched] struct {
	// send stores the entries of a batch and gives each its outcome. The
	// batch outlives any one caller's context; ctx is the first entry's,
	// without its cancellation, for its values (the trace).
	send func(ctx context.Context, entries []E)
	// key, when not nil, returns the id that one batch holds at most
	// once, and whether e has one: a call whose key is in the open batch
	// joins a later one, which goes out after it, so that the two behave
	// as two calls one after the other.
	key func(e E) (api.TaskID, bool)
	// weight, when not nil, returns what e adds to its batch toward
	// maxWeight (a workflow's nodes); a call heavier than maxWeight goes
	// in a batch of its own.
	weight func(e E) int
	// maxEntries and maxWeight make a batch full. Zero maxWeight: none.
	maxEntries, maxWeight int
}

// batched is an entry of a batchQueue: a pointer to a struct that embeds
// queued.
type batched interface{ base() *queued }

// queued is what a batchQueue keeps of every call.
type queued struct {
	ctx  context.Context // the caller's, for its values
	gone bool            // the caller gave up before its batch went out
}

func (q *queued) base() *queued { return q }

// batch is a batch of a batchQueue.
type batch[E batched] struct {
	entries []E
	keys    map[api.TaskID]struct{}
	weight  int
	sent    bool
	// done is closed once send returned.
	done chan struct{}
}

// full reports whether b goes out without waiting for the batches in the
// database.
func (k *batchKind[E]) full(b *batch[E]) bool {
	return len(b.entries) >= k.maxEntries || (k.maxWeight > 0 && b.weight >= k.maxWeight)
}

// takes reports whether b, not sent yet, may take e of weight w.
func (k *batchKind[E]) takes(b *batch[E], e E, w int) bool {
	if k.full(b) || (k.maxWeight > 0 && len(b.entries) > 0 && b.weight+w > k.maxWeight) {
		return false
	}
	if k.key != nil {
		if id, ok := k.key(e); ok {
			_, dup := b.keys[id]
			return !dup
		}
	}
	return true
}

// add appends e of weight w to b.
func (k *batchKind[E]) add(b *batch[E], e E, w int) {
	b.entries = append(b.entries, e)
	b.weight += w
	if k.key != nil {
		if id, ok := k.key(e); ok {
			if b.keys == nil {
				b.keys = map[api.TaskID]struct{}{}
			}
			b.keys[id] = struct{}{}
		}
	}
}

// do adds e, whose queued.ctx is ctx, to a batch and returns once the
// batch's send returned, reporting true; or, when ctx ends before the
// batch went out, at once, reporting false: e was not sent. The caller
// sends its own batch when it goes out now; full ones that go with it go
// side by side, each in a goroutine.
func (q *batchQueue[E]) do(ctx context.Context, e E) bool {
	e.base().ctx = ctx
	w := 1
	if q.kind.weight != nil {
		w = q.kind.weight(e)
	}
	q.mu.Lock()
	b := q.join(e, w)
	send := q.take()
	q.mu.Unlock()
	own := false
	for _, s := range send {
		if s == b {
			own = true
		} else {
			go q.send(s)
		}
	}
	if own {
		q.send(b)
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		q.mu.Lock()
		if !b.sent {
			e.base().gone = true
			q.mu.Unlock()
			return false
		}
		q.mu.Unlock()
		<-b.done
	}
	return true
}

// join adds e of weight w to the first batch of the queue that takes it,
// or to a new one at the end. q.mu is held.
func (q *batchQueue[E]) join(e E, w int) *batch[E] {
	for _, b := range q.queue {
		if q.kind.takes(b, e, w) {
			q.kind.add(b, e, w)
			return b
		}
	}
	b := &batch[E]{done: make(chan struct{})}
	q.kind.add(b, e, w)
	q.queue = append(q.queue, b)
	return b
}

// take removes the batches that go out now from the queue, marks them
// sent and counts them in flight: the first when none is in flight, and
// full ones. Entries whose callers gave up are left out. q.mu is held.
func (q *batchQueue[E]) take() []*batch[E] {
	var out []*batch[E]
	for len(q.queue) > 0 && (q.inFlight == 0 || q.kind.full(q.queue[0])) {
		b := q.queue[0]
		q.queue[0] = nil
		q.queue = q.queue[1:]
		b.sent = true
		b.entries = slices.DeleteFunc(b.entries, func(e E) bool { return e.base().gone })
		q.inFlight++
		out = append(out, b)
	}
	return out
}

// send stores b's entries, and sends the batches that may go out now that
// b returned, each in a goroutine.
func (q *batchQueue[E]) send(b *batch[E]) {
	if len(b.entries) > 0 {
		q.kind.send(context.WithoutCancel(b.entries[0].base().ctx), b.entries)
	}
	close(b.done)
	q.mu.Lock()
	q.inFlight--
	next := q.take()
	q.mu.Unlock()
	for _, s := range next {
		go q.send(s)
	}
}

// waiting returns how many calls wait in batches not sent yet, callers
// that gave up left out.
func (q *batchQueue[E]) waiting() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, b := range q.queue {
		for _, e := range b.entries {
			if !e.base().gone {
				n++
			}
		}
	}
	return n
}
