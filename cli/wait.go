package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/stinthq/stint/api"
)

// exitInterrupted is the exit code of a command that a Ctrl-C (SIGINT)
// stopped, as a shell reports it: 128 and the signal's number.
const exitInterrupted = 128 + int(syscall.SIGINT)

// interrupted is the cause of the end of a command's context that a
// signal ended.
type interrupted struct{ sig os.Signal }

// Error names the signal.
func (i interrupted) Error() string { return i.sig.String() + " signal received" }

// signalContext returns a context that the first of sigs to arrive ends,
// its cause an interrupted naming the signal. After that signal, sigs
// have their default action again, so that a second one ends the process
// at once. stop ends the context and the signals' relay.
func signalContext(sigs ...os.Signal) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			cancel(interrupted{s})
		case <-done:
		}
		signal.Stop(ch)
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() { close(done) })
		cancel(nil)
	}
}

// interruptCode is the exit code of a command whose context ctx ended:
// 128 and the number of the signal that ended it, 130 (Ctrl-C's) when no
// signal did (a caller of Run cancelled it).
func interruptCode(ctx context.Context) int {
	var i interrupted
	if errors.As(context.Cause(ctx), &i) {
		if s, ok := i.sig.(syscall.Signal); ok {
			return 128 + int(s)
		}
	}
	return exitInterrupted
}

// awaited names what a command waits for, for its messages: a task, a
// workflow or an ingest batch, and the command that shows it.
type awaited struct {
	what string // "task", "workflow" or "batch"
	id   api.TaskID
	show string // the command that shows it: "tasks", "workflows" or "batches"
	// submitted is set when the command submitted it: not found, it was
	// removed meanwhile.
	submitted bool
}

// waitEnded is the error of a wait for a, by a command whose context is
// ctx, that ended with err before a ended (nil for nil). Stopped by a
// signal or by ctx's end, it says so on stderr, and where a goes on, and
// exits 130 for Ctrl-C (see interruptCode); past the command's --timeout
// (timeout, 0 for none) it says a is still there.
func (c *cli) waitEnded(ctx context.Context, a awaited, timeout time.Duration, err error) error {
	show := fmt.Sprintf("%s %s show %s", c.name, a.show, a.id)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		fmt.Fprintf(c.stderr, "stopped waiting for %s %s; it runs on: %s\n", a.what, a.id, show)
		return silentExit(interruptCode(ctx))
	case timeout > 0 && errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("gave up waiting for %s %s after %s; it is still there: see '%s'", a.what, a.id, timeout, show)
	case errors.Is(err, api.ErrNotFound) && a.submitted:
		return fmt.Errorf("%s %s was removed while waiting for it", a.what, a.id)
	case errors.Is(err, api.ErrNotFound):
		return fmt.Errorf("%s %s not found", a.what, a.id)
	}
	return fmt.Errorf("wait for %s %s: %w", a.what, a.id, err)
}
