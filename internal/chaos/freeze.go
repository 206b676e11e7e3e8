package chaos

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/stinthq/stint/internal/childtest"
	"github.com/stinthq/stint/internal/faultpoint"
)

// envFreezeAt names the fault point at which a node process stops
// itself, once, the first time it reaches it after a SIGUSR1.
const envFreezeAt = "STINT_CHAOS_FREEZE_AT"

// FrozenLine is what a process prints on stdout right before it stops
// itself.
const FrozenLine = "frozen"

// freezeOnSignal makes the process stop itself at point the first time it
// reaches it after a SIGUSR1.
func freezeOnSignal(point string) {
	var armed atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	go func() {
		for range sig {
			armed.Store(true)
		}
	}()
	faultpoint.Set(func(p string) {
		if p == point && armed.CompareAndSwap(true, false) {
			freezeSelf()
		}
	})
}

// freezeAtOnce makes the process stop itself at point the first time it
// reaches it.
func freezeAtOnce(point string) {
	var done atomic.Bool
	faultpoint.Set(func(p string) {
		if p == point && done.CompareAndSwap(false, true) {
			freezeSelf()
		}
	})
}

// freezeSelf prints FrozenLine and stops the process until a SIGCONT.
func freezeSelf() {
	fmt.Println(FrozenLine)
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
}

// RunFreezing is a process that runs work, stopping itself the first
// time it reaches point; it prints childtest.Ready before. Once let go,
// its transaction was ended by the server, and work fails.
func RunFreezing(point string, work func(ctx context.Context) error) {
	freezeAtOnce(point)
	fmt.Println(childtest.Ready)
	if err := work(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(0)
}
