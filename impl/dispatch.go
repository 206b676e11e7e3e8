package impl

import (
	"slices"
	"sync"
	"time"
)

// workerIdle is how long a worker goroutine waits for a next run before it
// exits: between one and two times this.
const workerIdle = 10 * time.Second

// dispatch is the queue of runs waiting for a worker goroutine, and the
// workers parked waiting for a run. A worker takes runs from the queue
// until it is empty, so that a burst of short runs costs a few goroutine
// wake-ups rather than one per run. A run that blocks must not hold up
// the ones queued behind it: while runs wait, one more worker is always
// being woken (or started), and it wakes the next when it takes a run and
// runs still wait.
type dispatch struct {
	mu     sync.Mutex
	queue  []*run          // runs waiting for a worker, oldest from head
	head   int             // index of the oldest run in queue
	idle   []chan struct{} // wake channels of parked workers, latest parked last
	waking bool            // a worker was woken or started and has not looked at the queue yet
}

// queueRuns queues runs and wakes a worker for them.
func (s *Server) queueRuns(runs []*run) {
	d := &s.dispatch
	d.mu.Lock()
	d.queue = append(d.queue, runs...)
	wake, start := d.wakeLocked()
	d.mu.Unlock()
	s.wakeWorker(wake, start)
}

// wakeLocked picks the worker to wake when runs wait and none is being
// woken: a parked one (wake), or a new one (start).
func (d *dispatch) wakeLocked() (wake chan struct{}, start bool) {
	if d.waking || d.head == len(d.queue) {
		return nil, false
	}
	d.waking = true
	if n := len(d.idle); n > 0 {
		wake = d.idle[n-1]
		d.idle[n-1] = nil
		d.idle = d.idle[:n-1]
		return wake, false
	}
	return nil, true
}

func (s *Server) wakeWorker(wake chan struct{}, start bool) {
	switch {
	case wake != nil:
		wake <- struct{}{} // buffered: its worker is parked, or about to wait
	case start:
		go s.worker()
	}
}

// nextRun takes the oldest queued run. With none queued it parks the
// worker: wake is then listed among the idle workers, and nil is returned.
// woken says the worker was woken (or started) to take a run.
func (s *Server) nextRun(wake chan struct{}, woken bool) *run {
	d := &s.dispatch
	d.mu.Lock()
	if woken {
		d.waking = false
	}
	if d.head == len(d.queue) {
		d.idle = append(d.idle, wake)
		d.mu.Unlock()
		return nil
	}
	r := d.queue[d.head]
	d.queue[d.head] = nil
	d.head++
	if d.head == len(d.queue) {
		d.queue, d.head = d.queue[:0], 0
	}
	next, start := d.wakeLocked()
	d.mu.Unlock()
	s.wakeWorker(next, start)
	return r
}

// unpark takes a parked worker off the idle list, unless it was woken
// meanwhile; it reports whether it did.
func (s *Server) unpark(wake chan struct{}) bool {
	d := &s.dispatch
	d.mu.Lock()
	defer d.mu.Unlock()
	if i := slices.Index(d.idle, wake); i >= 0 {
		d.idle = slices.Delete(d.idle, i, i+1)
		return true
	}
	return false
}

// worker executes queued runs, parking while there are none, until it
// idles for workerIdle or the server stops. Reusing goroutines keeps their
// grown stacks: a fresh goroutine per run spent a tenth of the CPU on stack
// growth. The idle timer is not reset per run (that showed in CPU
// profiles); a worker that ran anything since the timer last fired waits
// another round.
func (s *Server) worker() {
	wake := make(chan struct{}, 1)
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	woken, busy := true, true
	for {
		if r := s.nextRun(wake, woken); r != nil {
			woken, busy = false, true
			s.execute(r)
			continue
		}
	wait:
		select {
		case <-wake:
			woken = true
		case <-idle.C:
			if busy {
				busy = false
				idle.Reset(workerIdle)
				goto wait
			}
			if s.unpark(wake) {
				return
			}
			<-wake // taken off the idle list to be woken: the wake-up is on its way
			woken = true
		case <-s.workersDone:
			return
		}
	}
}
