package impl

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// maxCompletionBatch caps the completions recorded by one statement, and
// maxCompletionBytes their results (a completion alone may have more): a
// statement that wrote 200 results of a megabyte outran its deadline each
// time it was tried, and its tasks ran again after their leases.
const (
	maxCompletionBatch = 1000
	maxCompletionBytes = maxClaimBytes
)

// completer records finished runs in batches: it takes whatever runs ended
// while the previous statement was in flight, so that under load one
// statement records hundreds of completions and at low load a completion is
// recorded at once.
//
// Ended runs wait in a slice that the completer takes from, not in a
// bounded channel: a run's goroutine never waits for the record, and a
// channel cost a lock and, on the completer's side, a select per run, which
// showed in CPU profiles. Under load a full channel held the goroutines of
// the runs that ended meanwhile (their slots were free already, so more
// runs were claimed and more goroutines started): thousands per burn-down.
type completer struct {
	st  store.Store
	log *slog.Logger
	inc *incidents
	// recorded is called from the completer's goroutine with a batch once
	// its completions are recorded (held[i] set, err nil), found fenced out
	// (held[i] unset, err nil), or given up on (err the database error). It
	// must be quick.
	recorded func(batch []*run, held []bool, err error)
	// offer, when set, returns before each statement the local start of
	// workflow nodes the batch may make on this node and the hand-over of
	// the slots its runs kept (see Server.offerStarts; a zero one makes
	// none), and the function that ends it with the tasks the statement
	// started (none when it failed), when it was sent and its error.
	offer func(batch []*run) (store.LocalStart, func(started []store.Claimed, sent time.Time, err error))
	// timeout is the deadline of a batch's first try (dbTimeout; tests
	// shorten it).
	timeout time.Duration

	wake    chan struct{} // signalled when pending was empty and got a run
	mu      sync.Mutex
	pending []*run // ended runs, oldest from head; those before head are taken
	head    int
	busy    bool // a batch is being recorded, or a run promised to come (see promise)
}

// promise reports whether a run that ends now would be recorded at once:
// no batch is being recorded, none waits, and no other run was promised
// so. If it would, the run is promised so, until the completer takes
// its batch: a run's slot kept for the hand-over of its finish (see
// Server.handsOver) waits for that finish, which must not wait for
// another batch to return first.
func (c *completer) promise() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy || len(c.pending) > c.head {
		return false
	}
	c.busy = true
	return true
}

func newCompleter(st store.Store, log *slog.Logger, inc *incidents, recorded func([]*run, []bool, error)) *completer {
	return &completer{st: st, log: log, inc: inc, recorded: recorded, wake: make(chan struct{}, 1), timeout: dbTimeout}
}

// finish queues r for the record and returns. Not waiting frees the run's
// goroutine for the next run at once, so a node needs about as many
// goroutines as runs execute, not as many as wait to be recorded.
func (c *completer) finish(r *run) {
	c.mu.Lock()
	c.pending = append(c.pending, r)
	first := len(c.pending)-c.head == 1
	c.mu.Unlock()
	if first {
		signal(c.wake)
	}
}

// take moves up to maxCompletionBatch of the pending runs, oldest first,
// to batch, and no more than maxCompletionBytes of their results, and
// orders batch by task id (byte order). A finish locks its tasks' rows in
// its completions' order, and in id order it never waits in a cycle with
// another writer of many tasks that locks them in id order too (a signal
// to many tasks, another node's finish of a workflow's nodes).
func (c *completer) take(batch []*run) []*run {
	batch = c.takeOldest(batch)
	slices.SortFunc(batch, func(a, b *run) int { return strings.Compare(string(a.claimed.ID), string(b.claimed.ID)) })
	return batch
}

// takeOldest is take without the order by id.
func (c *completer) takeOldest(batch []*run) []*run {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := min(len(c.pending)-c.head, maxCompletionBatch)
	size := 0
	for i := range n {
		size += len(c.pending[c.head+i].end.Result)
		if i > 0 && size > maxCompletionBytes {
			n = i
			break
		}
	}
	c.busy = n > 0
	batch = append(batch[:0], c.pending[c.head:c.head+n]...)
	clear(c.pending[c.head : c.head+n])
	c.head += n
	switch {
	case c.head == len(c.pending) && cap(c.pending) > 4*maxCompletionBatch:
		c.pending, c.head = nil, 0 // let a backlog's slice go
	case c.head == len(c.pending):
		c.pending, c.head = c.pending[:0], 0
	case c.head >= maxCompletionBatch:
		// Runs keep coming: move the rest to the front, or the slice
		// would grow for as long as they do.
		rest := copy(c.pending, c.pending[c.head:])
		clear(c.pending[rest:])
		c.pending, c.head = c.pending[:rest], 0
	}
	return batch
}

// loop records completions until ctx ends. Runs are all over by then
// (Server.Stop waits for them first).
func (c *completer) loop(ctx context.Context) {
	batch := make([]*run, 0, maxCompletionBatch)
	var comps []store.Completion
	for {
		if batch = c.take(batch); len(batch) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-c.wake:
			}
			continue
		}
		comps = comps[:0]
		for _, r := range batch {
			comps = append(comps, r.end)
		}
		c.flush(ctx, batch, comps)
		clear(batch) // the runs are over: let them go
		clear(comps) // and their results
	}
}

// maxFinishTimeout bounds the deadline of a finish tried again after it
// outran its deadline (see completer.flush).
const maxFinishTimeout = 2 * time.Minute

// flush records a batch, retrying database errors for a while: a
// completion is worth keeping, and the leases keep being renewed meanwhile.
// Given up on, the runs' tasks are taken over after their lease. A try
// that outran its deadline is given twice as long the next time, up to
// maxFinishTimeout: a finish that must wake a fan-out of 100,000 nodes
// can take longer than dbTimeout on a busy database, and tried again
// with the same deadline it would never be recorded.
func (c *completer) flush(ctx context.Context, batch []*run, comps []store.Completion) {
	var err error
	timeout := c.timeout
	for try := 1; try <= 8; try++ {
		var held []bool
		var start store.LocalStart
		var started func([]store.Claimed, time.Time, error)
		if c.offer != nil {
			start, started = c.offer(batch)
		}
		sent := time.Now()
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout) // one that does not return by then is tried again
		if start.Reserve != nil || len(start.HandOver) > 0 {
			var tasks []store.Claimed
			held, tasks, err = c.st.FinishStart(fctx, comps, start)
			// The started runs begin before the batch's runs are let go
			// (recorded), so that Server.Stop, which waits for the runs,
			// never finds none in between.
			started(tasks, sent, err)
		} else {
			held, err = c.st.Finish(fctx, comps)
		}
		if errors.Is(fctx.Err(), context.DeadlineExceeded) {
			timeout = min(2*timeout, maxFinishTimeout)
		}
		cancel()
		if err == nil {
			c.inc.ok(false)
			c.recorded(batch, held, nil)
			return
		}
		if !c.inc.failed("finish", err) {
			c.log.Warn("stint: recording completions failed; retrying", "tasks", len(batch), "try", try, "err", err)
		}
		sleep(ctx, spi.Backoff(50*time.Millisecond, 2*time.Second, try))
	}
	c.recorded(batch, nil, err)
}
