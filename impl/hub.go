package impl

import (
	"context"
	"crypto/rand"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// hub owns a process's LISTEN connection and fans notifications out: finish
// notifications to the Awaits waiting on those tasks, due notifications to a
// server's claimer. It starts on first use.
type hub struct {
	st  store.Store
	log *slog.Logger
	// state is told of every failure of the listening connection and of
	// each time it listens again.
	state func(error)

	mu        sync.Mutex
	waiters   map[api.TaskID]map[chan struct{}]struct{}
	onDue     func()
	onRemoved func(api.TaskID)
	onCapped  func(api.BehaviorID)
	onListen  func()
	// listening says whether the listening connection listens now.
	listening atomic.Bool
	// self is the payload of this process's own kicks (kicker.token):
	// their due notifications are not dispatched, since the kick woke the
	// local claimers itself.
	self   string
	all    map[chan struct{}]struct{} // woken by every finish notification
	cancel context.CancelFunc
	done   chan struct{}
}

func newHub(st store.Store, log *slog.Logger, state func(error)) *hub {
	return &hub{st: st, log: log, state: state, waiters: map[api.TaskID]map[chan struct{}]struct{}{}, all: map[chan struct{}]struct{}{}}
}

// start begins listening, once, for good: a listener that returns an error
// is started again after a pause, never left stopped.
func (h *hub) start() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan struct{})
	state := func(err error) {
		h.listening.Store(err == nil)
		h.state(err)
		if err == nil {
			h.mu.Lock()
			fn := h.onListen
			h.mu.Unlock()
			if fn != nil {
				fn()
			}
		}
	}
	go func() {
		defer close(h.done)
		for ctx.Err() == nil {
			err := h.st.Listen(ctx, []string{store.ChannelDue, store.ChannelFinished, store.ChannelRemoved, store.ChannelCapped}, h.dispatch, state)
			if err != nil && ctx.Err() == nil {
				state(err)
				sleep(ctx, time.Second)
			}
		}
	}()
}

func (h *hub) close() {
	h.mu.Lock()
	cancel, done := h.cancel, h.done
	h.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// setOnDue sets the function called on due notifications.
func (h *hub) setOnDue(fn func()) {
	h.mu.Lock()
	h.onDue = fn
	h.mu.Unlock()
}

// setOnRemoved sets the function called with the id of a removed task.
func (h *hub) setOnRemoved(fn func(api.TaskID)) {
	h.mu.Lock()
	h.onRemoved = fn
	h.mu.Unlock()
}

// setOnCapped sets the function called with the id of a behavior that a
// cap across nodes held back.
func (h *hub) setOnCapped(fn func(api.BehaviorID)) {
	h.mu.Lock()
	h.onCapped = fn
	h.mu.Unlock()
}

// setOnListen sets the function called each time the hub listens, the
// first time and after every failure of its connection: notifications
// sent while it did not listen were lost.
func (h *hub) setOnListen(fn func()) {
	h.mu.Lock()
	h.onListen = fn
	h.mu.Unlock()
}

// waitAll registers interest in every finish notification.
func (h *hub) waitAll() (<-chan struct{}, func()) {
	h.start()
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	h.all[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.all, ch)
		h.mu.Unlock()
	}
}

// wait registers interest in id. The channel receives a value when the
// task may have changed; stop unregisters.
func (h *hub) wait(id api.TaskID) (<-chan struct{}, func()) {
	h.start()
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	set := h.waiters[id]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		h.waiters[id] = set
	}
	set[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(set, ch)
		if len(set) == 0 {
			delete(h.waiters, id)
		}
		h.mu.Unlock()
	}
}

func (h *hub) dispatch(channel, payload string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch channel {
	case store.ChannelDue:
		if h.onDue != nil && (payload == "" || payload != h.self) {
			h.onDue()
		}
	case store.ChannelRemoved:
		if h.onRemoved != nil && payload != "" {
			h.onRemoved(api.TaskID(payload))
		}
	case store.ChannelCapped:
		if h.onCapped != nil && payload != "" {
			h.onCapped(api.BehaviorID(payload))
		}
	case store.ChannelFinished:
		signalAll(h.all)
		if payload == "" {
			for _, set := range h.waiters {
				signalAll(set)
			}
			return
		}
		for _, id := range strings.Split(payload, ",") {
			signalAll(h.waiters[api.TaskID(id)])
		}
	}
}

func signalAll(set map[chan struct{}]struct{}) {
	for ch := range set {
		signal(ch)
	}
}

// signal sends on a buffered wake-up channel without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// kicker coalesces the due notifications of submits: at most one per
// window, and one more at the window's end when submits came during it, so
// that a burst of submits costs a few notifications, never one each
// (NOTIFY takes a database-wide lock at commit). The first submit of a
// window notifies inside its own statement (lead), saving a round trip;
// the window's trailing notification is a statement of its own.
type kicker struct {
	st     store.Store
	log    *slog.Logger
	window time.Duration

	// token is the payload of the kicker's notifications, by which this
	// process's hub knows its own (see hub.self).
	token string

	mu      sync.Mutex
	last    time.Time
	pending bool
	local   func() // wakes the local claimers; set by Server.Start
	sent    atomic.Int64
	// sending counts the trailing notifications not sent yet, which
	// Client.Close awaits: sent after the store's pool closed, they fail.
	sending sync.WaitGroup
	// later holds the kicks waiting for delayed tasks to fall due, by
	// their time in Unix milliseconds; closed stops them for good.
	later  map[int64]*time.Timer
	closed bool
}

// Bounds of the kicks that wait for delayed tasks (see kickAfter): a task
// due later than maxKickDelay after its submit, or past maxLaterKicks
// waiting kicks, is left to the claimers' poll, which is then late by a
// small part of its delay at most.
const (
	maxKickDelay  = time.Minute
	maxLaterKicks = 1024
)

func newKicker(st store.Store, log *slog.Logger) *kicker {
	return &kicker{st: st, log: log, window: 5 * time.Millisecond, token: rand.Text()}
}

// lead reports whether the submit about to go out should notify in its
// own statement: no notification went out in the last window.
func (k *kicker) lead() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pending || time.Since(k.last) < k.window {
		return false
	}
	k.last = time.Now()
	k.sent.Add(1)
	return true
}

// setLocal sets the function that wakes this process's own claimers.
func (k *kicker) setLocal(fn func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.local = fn
}

// wakeLocal wakes this process's own claimers, if it is a server, and
// sends no notification: for a statement that notified on its own.
func (k *kicker) wakeLocal() {
	k.mu.Lock()
	local := k.local
	k.mu.Unlock()
	if local != nil {
		local()
	}
}

// kick follows a submit: it wakes the local claimer, and unless the submit
// notified (led), makes sure a notification goes out by the window's end.
func (k *kicker) kick(led bool) { k.kickWith(led, true) }

// kickOthers makes sure a notification goes out by the window's end, for
// the claimers of the other processes only: the caller woke its own as it
// needed.
func (k *kicker) kickOthers() { k.kickWith(false, false) }

// kickWith is kick, waking the local claimer only with wake.
func (k *kicker) kickWith(led, wake bool) {
	k.mu.Lock()
	local := k.local
	if !wake {
		local = nil
	}
	if led || k.pending {
		k.mu.Unlock()
		if local != nil {
			local()
		}
		return
	}
	k.pending = true
	wait := k.window - time.Since(k.last)
	k.mu.Unlock()
	if local != nil {
		local()
	}
	k.sending.Add(1)
	send := func() {
		defer k.sending.Done()
		k.mu.Lock()
		k.pending = false
		k.last = time.Now()
		k.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		k.sent.Add(1)
		if err := k.st.Notify(ctx, store.ChannelDue, k.token); err != nil {
			k.log.Warn("stint: due notification failed; claimers will poll", "err", err)
		}
	}
	if wait <= 0 {
		go send()
		return
	}
	time.AfterFunc(wait, send)
}

// kickAfter kicks the claimers once d has passed, for a submit whose
// earliest task falls due then: without it, a task due a moment after its
// submit would wait for the claimers' next poll (a second by default).
// Kicks falling due in the same millisecond are one.
func (k *kicker) kickAfter(d time.Duration) {
	if d <= 0 || d > maxKickDelay {
		return
	}
	at := time.Now().Add(d).Truncate(time.Millisecond).Add(time.Millisecond)
	key := at.UnixMilli()
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.later[key]; ok || k.closed || len(k.later) >= maxLaterKicks {
		return
	}
	if k.later == nil {
		k.later = map[int64]*time.Timer{}
	}
	k.later[key] = time.AfterFunc(time.Until(at), func() {
		k.mu.Lock()
		delete(k.later, key)
		if k.closed {
			k.mu.Unlock()
			return
		}
		// Counted before close can see it, so that close waits for it.
		k.sending.Add(1)
		k.mu.Unlock()
		defer k.sending.Done()
		k.kick(false)
	})
}

// stored follows a store of tasks outside a caller's transaction: it
// kicks the claimers at once when a task is due now (led: the statement
// notified), and again when the earliest delayed one, due after delay,
// falls due.
func (k *kicker) stored(due, led bool, delay time.Duration) {
	if due {
		k.kick(led)
	}
	k.kickAfter(delay)
}

// flush waits for the trailing notifications to go out: at most a window
// and a notification's round trip.
func (k *kicker) flush() { k.sending.Wait() }

// close drops the kicks waiting for delayed tasks and waits for the
// notifications under way.
func (k *kicker) close() {
	k.mu.Lock()
	k.closed = true
	for _, t := range k.later {
		t.Stop()
	}
	k.later = nil
	k.mu.Unlock()
	k.flush()
}
