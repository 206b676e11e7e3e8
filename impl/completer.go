package impl

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// maxCompletionBatch caps the completions recorded by one statement.
const maxCompletionBatch = 1000

// completer records finished runs in batches: it takes whatever runs ended
// while the previous statement was in flight, so that under load one
// statement records hundreds of completions and at low load a completion is
// recorded at once.
type completer struct {
	st  store.Store
	log *slog.Logger
	in  chan *pendingCompletion
}

type pendingCompletion struct {
	c    store.Completion
	done func(error)
}

func newCompleter(st store.Store, log *slog.Logger) *completer {
	return &completer{st: st, log: log, in: make(chan *pendingCompletion, maxCompletionBatch)}
}

// finish queues comp and returns; done is called from the completer's
// goroutine once comp is recorded (nil), found fenced out (api.ErrHalt), or
// given up on (the database error). done must be quick. Not waiting frees
// the run's goroutine for the next run at once, so a node needs about as
// many goroutines as runs execute, not as many as wait to be recorded.
func (c *completer) finish(comp store.Completion, done func(error)) {
	c.in <- &pendingCompletion{c: comp, done: done}
}

// loop records completions until ctx ends. Runs are all over by then
// (Server.Stop waits for them first).
func (c *completer) loop(ctx context.Context) {
	batch := make([]*pendingCompletion, 0, maxCompletionBatch)
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-c.in:
			batch = append(batch[:0], p)
		}
	drain:
		for len(batch) < maxCompletionBatch {
			select {
			case p := <-c.in:
				batch = append(batch, p)
			default:
				break drain
			}
		}
		c.flush(ctx, batch)
	}
}

// flush records a batch, retrying database errors for a while: a
// completion is worth keeping, and the leases keep being renewed meanwhile.
func (c *completer) flush(ctx context.Context, batch []*pendingCompletion) {
	comps := make([]store.Completion, len(batch))
	for i, p := range batch {
		comps[i] = p.c
	}
	var err error
	for try := 1; try <= 8; try++ {
		var ok []bool
		if ok, err = c.st.Finish(context.WithoutCancel(ctx), comps); err == nil {
			for i, p := range batch {
				if ok[i] {
					p.done(nil)
				} else {
					p.done(fmt.Errorf("finish task %s: %w", p.c.ID, api.ErrHalt))
				}
			}
			return
		}
		c.log.Warn("stint: recording completions failed; retrying", "tasks", len(batch), "try", try, "err", err)
		sleep(ctx, spi.Backoff(50*time.Millisecond, 2*time.Second, try))
	}
	for _, p := range batch {
		p.done(err)
	}
}
