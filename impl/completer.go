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
	in  chan ending
}

// An ending is a run's end waiting to be recorded.
type ending interface {
	// completion is what to record.
	completion() *store.Completion
	// recorded is called from the completer's goroutine once the
	// completion is recorded (nil), found fenced out (api.ErrHalt), or
	// given up on (the database error). It must be quick.
	recorded(err error)
}

func newCompleter(st store.Store, log *slog.Logger) *completer {
	return &completer{st: st, log: log, in: make(chan ending, maxCompletionBatch)}
}

// finish queues e and returns. Not waiting frees the run's goroutine for
// the next run at once, so a node needs about as many goroutines as runs
// execute, not as many as wait to be recorded.
func (c *completer) finish(e ending) {
	c.in <- e
}

// loop records completions until ctx ends. Runs are all over by then
// (Server.Stop waits for them first).
func (c *completer) loop(ctx context.Context) {
	batch := make([]ending, 0, maxCompletionBatch)
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
func (c *completer) flush(ctx context.Context, batch []ending) {
	comps := make([]store.Completion, len(batch))
	for i, e := range batch {
		comps[i] = *e.completion()
	}
	var err error
	for try := 1; try <= 8; try++ {
		var ok []bool
		if ok, err = c.st.Finish(context.WithoutCancel(ctx), comps); err == nil {
			for i, e := range batch {
				if ok[i] {
					e.recorded(nil)
				} else {
					e.recorded(fmt.Errorf("finish task %s: %w", comps[i].ID, api.ErrHalt))
				}
			}
			return
		}
		c.log.Warn("stint: recording completions failed; retrying", "tasks", len(batch), "try", try, "err", err)
		sleep(ctx, spi.Backoff(50*time.Millisecond, 2*time.Second, try))
	}
	for _, e := range batch {
		e.recorded(err)
	}
}
