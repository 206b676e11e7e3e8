package main

// The durable-wait scenarios (--signals), stint against DBOS Transact for
// Go, each on a fresh database with the sender and the waiter timed on
// one clock, in one process:
//
//	signal resume  tasks asleep until a signal (stint: a run that returned
//	               spi.WaitForSignal; DBOS: a workflow in Recv with a
//	               timeout), each sent one signal in turn once the last
//	               one's run received its own: from the Signal (Send)
//	               call to the resumed run's Receive (Recv) returning
//	signals to N waiting
//	               N tasks asleep so; senders goroutines send each one a
//	               signal: signals/s until the last Signal returned, and
//	               tasks/s until every woken run finished
//	event          a running task publishes events one by one (SetEvent),
//	               each a gap after a client began to await it
//	               (AwaitEvent; DBOS: GetEvent): from the SetEvent call
//	               to the await returning

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// Names of the signals scenarios' rows.
const (
	scenarioResume  = "signal resume"
	scenarioEvent   = "event"
	metricResume    = "signal->receive"
	metricSent      = "signal"
	metricFinished  = "signal->finished"
	metricEvent     = "set->awaited"
	signalTopic     = "go"
	sysDBOSSendBulk = sysDBOS + " (SendBulk)"
	sysStintMany    = sysStint + " (SignalMany)"
	// signalChunk is the messages of a SignalMany (SendBulk) call.
	signalChunk = 1_000
)

// signalsConfig is what the signals scenarios' flags set.
type signalsConfig struct {
	on       bool
	resume   int           // signal resume: measured signals
	warmup   int           // signal resume and event: samples left out first
	tasks    int           // signals to N waiting: N
	senders  int           // signals to N waiting: sending goroutines
	events   int           // event: measured events
	eventGap time.Duration // event: from the await's call to the set
}

// defaultSignalsConfig is the signals scenarios' flags' defaults.
func defaultSignalsConfig() signalsConfig {
	return signalsConfig{resume: 200, warmup: 20, tasks: 10_000, senders: 16, events: 200, eventGap: 10 * time.Millisecond}
}

// addFlags adds the signals scenarios' flags.
func (s *signalsConfig) addFlags(fs *flag.FlagSet) {
	fs.BoolVar(&s.on, "signals", false, "run the durable-wait scenarios: signal resume one at a time, signals to many waiting tasks, event set to awaiter woken (stint, and DBOS with --systems including dbos); not run by default")
	fs.IntVar(&s.resume, "signals-resume", s.resume, "signals: signals sent one at a time, each to a task of its own, after the warm-up")
	fs.IntVar(&s.warmup, "signals-warmup", s.warmup, "signals: samples of signal resume and event left out first")
	fs.IntVar(&s.tasks, "signals-tasks", s.tasks, "signals: tasks asleep on a signal, all then signalled")
	fs.IntVar(&s.senders, "signals-senders", s.senders, "signals: goroutines sending the many tasks their signals")
	fs.IntVar(&s.events, "signals-events", s.events, "signals: events set one at a time, each awaited, after the warm-up")
	fs.DurationVar(&s.eventGap, "signals-event-gap", s.eventGap, "signals: from an await's call to the set of its event")
}

// check validates the flags.
func (s *signalsConfig) check() error {
	for name, v := range map[string]int{"signals-resume": s.resume, "signals-tasks": s.tasks, "signals-senders": s.senders, "signals-events": s.events} {
		if v <= 0 {
			return fmt.Errorf("--%s must be positive, not %d", name, v)
		}
	}
	if s.warmup < 0 || s.eventGap < 0 {
		return errors.New("--signals-warmup and --signals-event-gap must not be negative")
	}
	return nil
}

// scenarioMany names the throughput scenario's rows.
func (s *signalsConfig) scenarioMany() string {
	return fmt.Sprintf("signals to %s waiting", num(int64(s.tasks)))
}

// summary describes the signals scenarios for the report.
func (s *signalsConfig) summary() string {
	return fmt.Sprintf("%d signals one at a time (after %d), each to a task asleep on it (stint: spi.WaitForSignal; DBOS: Recv with a 1h timeout), Signal (Send) call to Receive (Recv) return; %s tasks asleep, signalled by %d goroutines (Signal, and SignalMany of 1,000; DBOS: Send, and SendBulk of 1,000), until the last send returned and until all finished; %d events (after %d) set by one running task, each %s after a client began awaiting it (AwaitEvent; DBOS: GetEvent), SetEvent call to the await's return; stint at its defaults; both ends in one process",
		s.resume, s.warmup, num(int64(s.tasks)), s.senders, s.events, s.warmup, s.eventGap)
}

// signalJobs returns the signals scenarios' jobs, a list per scenario
// whose runs are interleaved.
func (b *bench) signalJobs() [][]job {
	s := b.cfg.sig
	resume := []job{{scenarioResume, sysStint, b.signalResumeStint}}
	many := []job{
		{s.scenarioMany(), sysStint, func(ctx context.Context) ([]Result, error) { return b.signalManyStint(ctx, false) }},
		{s.scenarioMany(), sysStintMany, func(ctx context.Context) ([]Result, error) { return b.signalManyStint(ctx, true) }},
	}
	event := []job{{scenarioEvent, sysStint, b.eventStint}}
	if b.dbosBin != "" {
		resume = append(resume, job{scenarioResume, sysDBOS, b.signalResumeDBOS})
		many = append(many,
			job{s.scenarioMany(), sysDBOS, func(ctx context.Context) ([]Result, error) { return b.signalManyDBOS(ctx, false) }},
			job{s.scenarioMany(), sysDBOSSendBulk, func(ctx context.Context) ([]Result, error) { return b.signalManyDBOS(ctx, true) }})
		event = append(event, job{scenarioEvent, sysDBOS, b.eventDBOS})
	}
	return [][]job{resume, many, event}
}

// waitBehavior sleeps until a signal of signalTopic comes, then tells
// resumed and ends.
type waitBehavior struct{ resumed *probe }

var waitKind = api.Kind[struct{}, struct{}]{ID: "bench.wait"}

func (waitBehavior) Kind() api.Kind[struct{}, struct{}]        { return waitKind }
func (waitBehavior) TaskID(ids spi.IDs, _ struct{}) api.TaskID { return ids.Unique() }
func (w waitBehavior) Run(ctx context.Context, rc spi.RunContext, _ struct{}) (struct{}, error) {
	_, ok, err := rc.Receive(ctx, signalTopic)
	if err != nil {
		return struct{}{}, err
	}
	if !ok {
		return struct{}{}, spi.WaitForSignal(signalTopic, time.Hour)
	}
	w.resumed.run(func() string { return string(rc.TaskID()) })
	return struct{}{}, nil
}

// eventsBehavior sets its params' count of events, the next each time
// gate lets it, sending setAt the time of each SetEvent call.
type eventsBehavior struct {
	gate  chan struct{}
	setAt chan time.Time
}

var eventsKind = api.Kind[int, int]{ID: "bench.events"}

func (eventsBehavior) Kind() api.Kind[int, int]             { return eventsKind }
func (eventsBehavior) TaskID(ids spi.IDs, _ int) api.TaskID { return ids.Unique() }
func (e eventsBehavior) Run(ctx context.Context, rc spi.RunContext, k int) (int, error) {
	for i := range k {
		select {
		case <-e.gate:
		case <-ctx.Done():
			return i, ctx.Err()
		}
		e.setAt <- time.Now()
		if err := rc.SetEvent(ctx, eventKey(i), i); err != nil {
			return i, err
		}
	}
	return k, nil
}

func eventKey(i int) string { return fmt.Sprintf("e%d", i) }

// signalStint starts a stint server at its defaults, with a client on its
// own pool, on a fresh database called label, with the behaviors register
// adds; stop ends it.
func (b *bench) signalStint(ctx context.Context, label string, register func(*spi.Registry) error) (*stintHarness, func(), error) {
	return b.stintServer(ctx, label, stintOptions{client: true, defaults: true, register: register})
}

// sleepers submits n tasks of the wait behavior called prefix-<i> and
// returns their ids once all are asleep on the topic.
func sleepers(ctx context.Context, h *stintHarness, prefix string, n int) ([]api.TaskID, error) {
	ids := make([]api.TaskID, n)
	reqs := make([]api.SubmitRequest, n)
	for i := range ids {
		ids[i] = api.TaskID(fmt.Sprintf("%s-%06d", prefix, i))
		reqs[i] = api.SubmitRequest{Behavior: waitKind.ID, ID: ids[i]}
	}
	for lo := 0; lo < n; lo += 5_000 {
		if _, err := h.cli.SubmitMany(ctx, reqs[lo:min(lo+5_000, n)]); err != nil {
			return nil, fmt.Errorf("stint submit the waiting tasks: %w", err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if _, err := pollUntil(wctx, h.obs, 5*time.Millisecond, `SELECT count(*) >= $1 FROM stint_task WHERE signal_wait IS NOT NULL AND status = 'scheduled'`, n); err != nil {
		return nil, fmt.Errorf("wait for %d tasks asleep on a signal: %w", n, err)
	}
	return ids, nil
}

// signalResumeStint signals sleeping tasks one at a time.
func (b *bench) signalResumeStint(ctx context.Context) ([]Result, error) {
	s := b.cfg.sig
	resumed := &probe{}
	resumed.arm()
	h, stop, err := b.signalStint(ctx, "sig_resume_stint", func(reg *spi.Registry) error {
		return spi.Register[struct{}, struct{}](reg, waitBehavior{resumed: resumed})
	})
	if err != nil {
		return nil, err
	}
	defer stop()
	ids, err := sleepers(ctx, h, "resume", s.warmup+s.resume)
	if err != nil {
		return nil, err
	}
	win := begin()
	samples := make([]time.Duration, len(ids))
	for i, id := range ids {
		t0 := time.Now()
		if err := h.cli.Signal(ctx, id, signalTopic, i); err != nil {
			return nil, fmt.Errorf("stint signal %s: %w", id, err)
		}
		var t1 time.Time
		if err := waitFor(ctx, time.Minute, func() bool {
			var ok bool
			t1, ok = resumed.startOf(string(id))
			return ok
		}); err != nil {
			return nil, fmt.Errorf("stint: %s not resumed: %w", id, err)
		}
		samples[i] = t1.Sub(t0)
	}
	return []Result{{Scenario: scenarioResume, Metric: metricResume, System: sysStint, Tasks: int64(s.resume), samples: samples[s.warmup:], CPU: win.usage()}}, nil
}

// signalManyStint signals many sleeping tasks from several goroutines,
// with Signal or, with bulk, SignalMany of signalChunk messages.
func (b *bench) signalManyStint(ctx context.Context, bulk bool) ([]Result, error) {
	s := b.cfg.sig
	label, system := "sig_many_stint", sysStint
	if bulk {
		label, system = "sig_many_stint_bulk", sysStintMany
	}
	h, stop, err := b.signalStint(ctx, label, func(reg *spi.Registry) error {
		return spi.Register[struct{}, struct{}](reg, waitBehavior{resumed: &probe{}})
	})
	if err != nil {
		return nil, err
	}
	defer stop()
	ids, err := sleepers(ctx, h, "many", s.tasks)
	if err != nil {
		return nil, err
	}
	win := begin()
	var next atomic.Int64
	errs := make([]error, s.senders)
	var wg sync.WaitGroup
	for g := range s.senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if bulk {
				for lo := int(next.Add(signalChunk)) - signalChunk; lo < len(ids) && errs[g] == nil; lo = int(next.Add(signalChunk)) - signalChunk {
					reqs := make([]api.SignalRequest, 0, signalChunk)
					for i := lo; i < min(lo+signalChunk, len(ids)); i++ {
						reqs = append(reqs, api.SignalRequest{ID: ids[i], Topic: signalTopic, Payload: i})
					}
					errs[g] = h.cli.SignalMany(ctx, reqs)
				}
				return
			}
			for i := int(next.Add(1)) - 1; i < len(ids) && errs[g] == nil; i = int(next.Add(1)) - 1 {
				errs[g] = h.cli.Signal(ctx, ids[i], signalTopic, i)
			}
		}()
	}
	wg.Wait()
	sent := time.Since(win.start)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("stint signal: %w", err)
	}
	end, err := pollUntil(ctx, h.obs, 5*time.Millisecond, `SELECT count(*) >= $1 FROM stint_task WHERE status = 'success'`, s.tasks)
	if err != nil {
		return nil, err
	}
	cpu := win.usage()
	return manyResults(s, system, sent, end.Sub(win.start), cpu), nil
}

// manyResults are the rows of one run of the throughput scenario.
func manyResults(s signalsConfig, system string, sent, all time.Duration, cpu usage) []Result {
	return []Result{
		{Scenario: s.scenarioMany(), Metric: metricSent, System: system, Tasks: int64(s.tasks), Seconds: sent.Seconds(), CPU: cpu},
		{Scenario: s.scenarioMany(), Metric: metricFinished, System: system, Tasks: int64(s.tasks), Seconds: all.Seconds(), CPU: cpu},
	}
}

// eventStint awaits events a running task sets one by one.
func (b *bench) eventStint(ctx context.Context) ([]Result, error) {
	s := b.cfg.sig
	k := s.warmup + s.events
	ev := eventsBehavior{gate: make(chan struct{}), setAt: make(chan time.Time, k)}
	h, stop, err := b.signalStint(ctx, "event_stint", func(reg *spi.Registry) error {
		return spi.Register[int, int](reg, ev)
	})
	if err != nil {
		return nil, err
	}
	defer stop()
	const id = api.TaskID("events")
	if _, err := api.Submit(ctx, h.cli, eventsKind, k, api.WithID(id)); err != nil {
		return nil, fmt.Errorf("stint submit the events task: %w", err)
	}
	win := begin()
	samples := make([]time.Duration, k)
	for i := range k {
		got := make(chan error, 1)
		var t1 time.Time
		go func() {
			_, err := h.cli.AwaitEvent(ctx, id, eventKey(i))
			t1 = time.Now()
			got <- err
		}()
		sleep(ctx, s.eventGap)
		select {
		case ev.gate <- struct{}{}:
		case <-time.After(time.Minute):
			return nil, errors.New("stint: the events task did not run within a minute")
		}
		if err := <-got; err != nil {
			return nil, fmt.Errorf("stint await event %d: %w", i, err)
		}
		samples[i] = t1.Sub(<-ev.setAt)
	}
	return []Result{{Scenario: scenarioEvent, Metric: metricEvent, System: sysStint, Tasks: int64(s.events), samples: samples[s.warmup:], CPU: win.usage()}}, nil
}

// signalResumeDBOS is signalResumeStint's run on DBOS.
func (b *bench) signalResumeDBOS(ctx context.Context) ([]Result, error) {
	s := b.cfg.sig
	p, stop, err := b.dbosBench(ctx, "sig_resume_dbos", false)
	if err != nil {
		return nil, err
	}
	defer stop()
	win := begin()
	var got struct{ Samples []int64 }
	if err := askDBOS(ctx, p, fmt.Sprintf("resume %d", s.warmup+s.resume), &got); err != nil {
		return nil, err
	}
	if len(got.Samples) != s.warmup+s.resume {
		return nil, fmt.Errorf("dbos: resume answered %d samples, want %d", len(got.Samples), s.warmup+s.resume)
	}
	return []Result{{Scenario: scenarioResume, Metric: metricResume, System: sysDBOS, Tasks: int64(s.resume), samples: durations(got.Samples[s.warmup:]), CPU: win.usage()}}, nil
}

// signalManyDBOS is signalManyStint's run on DBOS, with Send or, with
// bulk, SendBulk.
func (b *bench) signalManyDBOS(ctx context.Context, bulk bool) ([]Result, error) {
	s := b.cfg.sig
	label, system, cmd := "sig_many_dbos", sysDBOS, fmt.Sprintf("throughput %d %d", s.tasks, s.senders)
	if bulk {
		label, system, cmd = "sig_many_dbos_bulk", sysDBOSSendBulk, cmd+" bulk"
	}
	p, stop, err := b.dbosBench(ctx, label, false)
	if err != nil {
		return nil, err
	}
	defer stop()
	var got struct{ Sent, All int64 }
	if err := askDBOS(ctx, p, cmd, &got); err != nil {
		return nil, err
	}
	// The process's window takes in the start of the sleeping workflows:
	// its CPU figures would not be the signals' alone.
	return manyResults(s, system, time.Duration(got.Sent)*time.Microsecond, time.Duration(got.All)*time.Microsecond, unknownUsage), nil
}

// eventDBOS is eventStint's run on DBOS.
func (b *bench) eventDBOS(ctx context.Context) ([]Result, error) {
	s := b.cfg.sig
	p, stop, err := b.dbosBench(ctx, "event_dbos", false)
	if err != nil {
		return nil, err
	}
	defer stop()
	win := begin()
	var got struct{ Samples []int64 }
	if err := askDBOS(ctx, p, fmt.Sprintf("events %d %s", s.warmup+s.events, s.eventGap), &got); err != nil {
		return nil, err
	}
	if len(got.Samples) != s.warmup+s.events {
		return nil, fmt.Errorf("dbos: events answered %d samples, want %d", len(got.Samples), s.warmup+s.events)
	}
	return []Result{{Scenario: scenarioEvent, Metric: metricEvent, System: sysDBOS, Tasks: int64(s.events), samples: durations(got.Samples[s.warmup:]), CPU: win.usage()}}, nil
}
