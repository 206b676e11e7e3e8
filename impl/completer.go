package impl

import (
	"context"
	"log/slog"
	"time"

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
	in  chan *run
	// recorded is called from the completer's goroutine with a batch once
	// its completions are recorded (held[i] set, err nil), found fenced out
	// (held[i] unset, err nil), or given up on (err the database error). It
	// must be quick.
	recorded func(batch []*run, held []bool, err error)
}

func newCompleter(st store.Store, log *slog.Logger, recorded func([]*run, []bool, error)) *completer {
	return &completer{st: st, log: log, in: make(chan *run, maxCompletionBatch), recorded: recorded}
}

// finish queues r and returns. Not waiting frees the run's goroutine for
// the next run at once, so a node needs about as many goroutines as runs
// execute, not as many as wait to be recorded.
func (c *completer) finish(r *run) {
	c.in <- r
}

// loop records completions until ctx ends. Runs are all over by then
// (Server.Stop waits for them first).
func (c *completer) loop(ctx context.Context) {
	batch := make([]*run, 0, maxCompletionBatch)
	var comps []store.Completion
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-c.in:
			batch = append(batch[:0], r)
		}
	drain:
		for len(batch) < maxCompletionBatch {
			select {
			case r := <-c.in:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		comps = comps[:0]
		for _, r := range batch {
			comps = append(comps, r.end)
		}
		c.flush(ctx, batch, comps)
		clear(batch) // the runs are over: let them go
	}
}

// flush records a batch, retrying database errors for a while: a
// completion is worth keeping, and the leases keep being renewed meanwhile.
func (c *completer) flush(ctx context.Context, batch []*run, comps []store.Completion) {
	var err error
	for try := 1; try <= 8; try++ {
		var held []bool
		if held, err = c.st.Finish(context.WithoutCancel(ctx), comps); err == nil {
			c.recorded(batch, held, nil)
			return
		}
		c.log.Warn("stint: recording completions failed; retrying", "tasks", len(batch), "try", try, "err", err)
		sleep(ctx, spi.Backoff(50*time.Millisecond, 2*time.Second, try))
	}
	c.recorded(batch, nil, err)
}
