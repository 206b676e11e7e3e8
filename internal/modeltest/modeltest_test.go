package modeltest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
)

var (
	flagSeed     = flag.Uint64("model.seed", 0, "run the one sequence of this seed")
	flagOps      = flag.String("model.ops", "", "TestModelReplay: the operations to replay, separated by ';'")
	flagNodes    = flag.Int("model.nodes", 2, "TestModelReplay: the nodes to start")
	flagLong     = flag.Bool("model.long", false, "run sequences for -model.duration (default 20m) instead of a few")
	flagDuration = flag.Duration("model.duration", 0, "run sequences for this long")
	flagSeqs     = flag.Int("model.seqs", 5, "sequences to run (without -model.long or -model.duration)")
	flagSteps    = flag.Int("model.steps", 40, "operations per sequence")
	flagDefects  = flag.String("model.defects", "none",
		"defects whose operations the generator leaves out, comma-separated, while they are being fixed; 'none' for none")
	flagProcs   = flag.Bool("model.procs", true, "also run nodes in child processes and kill them with SIGKILL")
	flagVerbose = flag.Bool("model.verbose", false, "log the nodes and every step")
)

func TestMain(m *testing.M) {
	if os.Getenv(envChildDSN) != "" {
		runChild()
		return
	}
	pgtest.Main(m)
}

func defects(t *testing.T) map[string]bool {
	out := map[string]bool{}
	if *flagDefects == "none" || *flagDefects == "" {
		return out
	}
	for _, d := range strings.Split(*flagDefects, ",") {
		if !slices.Contains(allDefects, d) {
			t.Fatalf("-model.defects: unknown defect %q (known: %s)", d, strings.Join(allDefects, ", "))
		}
		out[d] = true
	}
	return out
}

// TestModel runs random sequences of operations against the model and
// real nodes. A failure prints the seed and the operations for replay.
func TestModel(t *testing.T) {
	def := defects(t)
	if *flagSeed != 0 {
		runSequence(t, *flagSeed, *flagSteps, def, nil, 0, &stats{})
		return
	}
	base := rand.Uint64()
	duration := *flagDuration
	if *flagLong && duration == 0 {
		duration = 20 * time.Minute
	}
	steps := *flagSteps
	if duration > 0 && !flagSet("model.steps") {
		// Longer sequences reach states (many stale claim hints, deep
		// histories of ids) that short ones do not.
		steps = 100
	}
	start := time.Now()
	seqs, ops := 0, 0
	excluded, kinds := map[string]int{}, map[string]int{}
	for i := uint64(0); ; i++ {
		if duration > 0 && time.Since(start) > duration || duration == 0 && seqs >= *flagSeqs {
			break
		}
		seed := base + i
		st := stats{excluded: map[string]int{}}
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runSequence(t, seed, steps, def, nil, 0, &st) })
		seqs++
		ops += st.ops
		for k, v := range st.excluded {
			excluded[k] += v
		}
		for k, v := range st.kinds {
			kinds[k] += v
		}
		if !ok {
			break
		}
	}
	t.Logf("%d sequences, %d operations in %s (by kind: %v); operations left out per known defect: %v",
		seqs, ops, time.Since(start).Round(time.Second), kinds, excluded)
}

// TestModelReplay replays the operations of -model.ops (as a failing
// sequence printed them) on -model.nodes nodes.
func TestModelReplay(t *testing.T) {
	if *flagOps == "" {
		t.Skip("no -model.ops to replay")
	}
	ops, err := parseOps(*flagOps)
	if err != nil {
		t.Fatal(err)
	}
	runSequence(t, 0, len(ops), nil, ops, *flagNodes, &stats{})
}

// TestDefects replays, for each defect switch, the shortest sequence that
// reaches the defect. Each case is skipped while its switch is on (the
// default): run with -model.defects=none, or without the one switch, to
// see it fail before the fix and pass after.
func TestDefects(t *testing.T) {
	def := defects(t)
	for _, c := range []struct {
		defect string
		nodes  int
		ops    string
	}{
		{defectHoldWaitingParent, 2, "submit b=model.plain id=pl-3; finish id=pl-3 run=spawn children=1; hold id=pl-3; " +
			"finish id=ch-1 run=success; release id=pl-3"},
		{defectResubmitRetryWait, 2, "submit b=model.slow id=sl-3; finish id=sl-3 run=fail; submit b=model.slow id=sl-3"},
		{defectReleaseDropsDue, 2, "submit b=model.plain id=pl-3 delay=1h; hold id=pl-3; release id=pl-3"},
		{defectLostRunKeepsResubmit, 1, "submit b=model.plain id=pl-3; submit b=model.plain id=pl-3; stopnode node=node1; " +
			"finish id=pl-3 run=success"},
		// The parent is woken by the retried child's second end while the
		// child it spawned after the first end still runs.
		{defectRetriedChildNotPending, 2, "submit b=model.plain id=pl-3; finish id=pl-3 run=spawn children=1; " +
			"finish id=ch-1 run=failperm; retry id=ch-1; finish id=pl-3 run=spawn children=1; finish id=ch-1 run=success"},
		{defectOrphanChildCountsOffNewParent, 2, "submit b=model.plain id=pl-3; finish id=pl-3 run=spawn children=1; remove id=pl-3; " +
			"submit b=model.plain id=pl-3; finish id=pl-3 run=spawn children=1; finish id=ch-1 run=success"},
		// The signal reopened ch-1 without counting it on pl-3 again.
		{defectReopenedChildNotPending, 2, "submit b=model.plain id=pl-3; finish id=pl-3 run=spawn children=2; " +
			"finish id=ch-1 run=success; signal id=ch-1 p=1; finish id=ch-2 run=success"},
	} {
		t.Run(c.defect, func(t *testing.T) {
			if def[c.defect] {
				t.Skipf("known defect %s is excluded (-model.defects)", c.defect)
			}
			t.Parallel()
			ops, err := parseOps(c.ops)
			if err != nil {
				t.Fatal(err)
			}
			runSequence(t, 0, len(ops), nil, ops, c.nodes, &stats{})
		})
	}
}

// TestSignalOps replays a sequence that reaches each outcome of the
// signal operations, which a few random sequences may miss: a key seen, a
// SignalMany refused whole and one stored, a sleeper woken, a finished
// task reopened or refused, and what runs received.
func TestSignalOps(t *testing.T) {
	ops, err := parseOps("submit b=model.plain id=pl-1; signal id=pl-1 p=1 k=k1; signal id=pl-1 p=2 k=k1; " +
		"signalmany to=pl-1:3,sh-1:4; submit b=model.share id=sh-1 g=g1; signalmany to=pl-1:5:k2,sh-1:6,pl-1:7:k2; " +
		"finish id=pl-1 run=sleep; signalmany to=sh-1:8,pl-1:9; finish id=pl-1 run=recvfail; finish id=pl-1 run=success; " +
		"finish id=sh-1 run=success; signalmany to=pl-1:10:k3,sh-1:11; signal id=pl-1 p=12 k=k1; signal id=pl-1 p=13; " +
		"finish id=pl-1 run=sleep")
	if err != nil {
		t.Fatal(err)
	}
	runSequence(t, 0, len(ops), nil, ops, 2, &stats{})
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// stats are what a sequence did.
type stats struct {
	ops      int
	excluded map[string]int
	// kinds counts the operations by kind, a finish by its outcome
	// ("finish/sleep"), and some outcomes of other kinds apart
	// ("signalmany/refused", also counted in "signalmany").
	kinds map[string]int
}

// sequence is one run of operations against a model and a system.
type sequence struct {
	t        *testing.T
	ctx      context.Context
	h        *harness
	m        *model
	done     []op // applied so far, for the failure report
	seed     uint64
	nodes0   int // nodes started before the first step
	steps    int
	children int // children spawned, for their ids
	// outcomes counts outcomes of operations by kind ("signal/refused").
	outcomes map[string]int
}

// runSequence runs steps operations drawn from seed on 2 or 3 nodes, or
// the given ops on nodes nodes, and counts them in st (also when it
// fails).
func runSequence(t *testing.T, seed uint64, steps int, def map[string]bool, replay []op, nodes int, st *stats) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var verbose *os.File
	if *flagVerbose {
		verbose = os.Stderr
	}
	h, err := newHarness(ctx, pgtest.New(t), verbose)
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	g := &generator{rng: rng, defects: def, maxNodes: 3, excluded: map[string]int{}, children: *flagProcs}
	s := &sequence{t: t, ctx: ctx, h: h, m: newModel(maxWorkers), seed: seed, steps: steps, outcomes: map[string]int{}}
	defer func() {
		st.ops = len(s.done)
		st.excluded = g.excluded
		st.kinds = map[string]int{}
		for _, o := range s.done {
			k := string(o.kind)
			if o.kind == opFinish {
				k += "/" + o.run.String()
			}
			st.kinds[k]++
		}
		for k, n := range s.outcomes {
			st.kinds[k] += n
		}
	}()
	if replay == nil {
		nodes = 2 + rng.IntN(2)
	}
	s.nodes0 = nodes
	for range nodes {
		s.startNode()
	}
	for i := range steps {
		var o op
		if replay != nil {
			o = replay[i]
		} else {
			o = g.next(s.m)
		}
		s.step(o)
	}
	s.drain()
}

// fail reports a divergence with everything needed to replay it, and
// ends the test.
func (s *sequence) fail(format string, args ...any) {
	s.t.Helper()
	var ops []string
	for _, o := range s.done {
		ops = append(ops, o.String())
	}
	s.t.Fatalf("%s\n\nmodel:\n%s\nrun log:\n%s\nseed %d; replay with\n  go test ./internal/modeltest -run 'TestModel$' -model.seed=%d -model.steps=%d\nor, exactly these operations,\n  go test ./internal/modeltest -run TestModelReplay -model.nodes=%d -model.ops='%s'",
		fmt.Sprintf(format, args...), s.m.dump(), s.runLog(), s.seed, s.seed, s.steps, s.nodes0, strings.Join(ops, "; "))
}

func (s *sequence) startNode() {
	name, err := s.h.startNode()
	if err != nil {
		s.fail("start node: %v", err)
	}
	s.m.nodes = append(s.m.nodes, name)
}

// runLog lists the run log, for failure messages.
func (s *sequence) runLog() string {
	rows, err := s.h.pool.Query(context.Background(), `SELECT format('  %s %s attempt %s on %s, %s to %s%s', id, task_id, attempt, node,
		to_char(started, 'HH24:MI:SS.MS'), coalesce(to_char(ended, 'HH24:MI:SS.MS'), 'now'), CASE WHEN removed THEN ' (removed)' ELSE '' END)
		FROM model_run ORDER BY id`)
	if err != nil {
		return err.Error()
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err.Error()
	}
	return strings.Join(lines, "\n") + "\n"
}

// keepNodes starts an in-process node while fewer than two run.
func (s *sequence) keepNodes() {
	for len(s.m.nodes) < 2 {
		s.startNode()
	}
}

// expect checks an api call's error against the model's.
func (s *sequence) expect(o op, got, want error) {
	s.t.Helper()
	switch {
	case want == nil && got == nil:
	case want != nil && errors.Is(got, want):
	default:
		s.fail("%s: got error %v, model expects %v", o, got, want)
	}
}

// expectSignals applies the messages reqs of o to the model, checks the
// call's error against it, and counts what the model says happened:
// refused, stored but for keys seen, reopening a finished task.
func (s *sequence) expectSignals(o op, got error, reqs []sigReq) {
	s.t.Helper()
	reopens := s.m.reopens
	stored, want := s.m.signalMany(reqs)
	s.expect(o, got, want)
	switch {
	case want != nil:
		s.outcomes[string(o.kind)+"/refused"]++
	case stored < len(reqs):
		s.outcomes[string(o.kind)+"/keyseen"]++
	}
	if s.m.reopens > reopens {
		s.outcomes[string(o.kind)+"/reopen"]++
	}
}

// step applies one operation to the system and the model, waits until
// the system settles, and checks it.
func (s *sequence) step(o op) {
	s.t.Helper()
	s.done = append(s.done, o)
	if *flagVerbose {
		s.t.Logf("step %d: %s", len(s.done), o)
	}
	ctx, h, m := s.ctx, s.h, s.m
	switch o.kind {
	case opSubmit:
		var delay time.Duration
		d := dueNow
		if o.delay {
			delay, d = time.Hour, dueFuture
		}
		var tasks api.Tasks = h.client
		if srv := h.nodes[o.node]; srv != nil {
			tasks = srv // a node's own submit: it may start the task at once
		}
		sub, err := tasks.Submit(ctx, api.SubmitRequest{Behavior: o.behavior, ID: o.id, GroupKey: o.group, Delay: delay})
		s.expect(o, err, nil)
		if created := m.submit(o.behavior, o.id, o.group, d); created != sub.Created {
			s.fail("%s: created %v, model %v", o, sub.Created, created)
		}
	case opDebounce:
		window, maxWait := debounceWindow(o.id)
		d := dueNow
		if window > time.Minute {
			d = dueFuture
		}
		sub, err := h.client.Submit(ctx, api.SubmitRequest{Behavior: o.behavior, ID: o.id, GroupKey: o.group,
			Debounce: &api.Debounce{Window: window, MaxWait: maxWait}})
		created, want := m.debounce(o.behavior, o.id, o.group, d)
		s.expect(o, err, want)
		if err == nil && created != sub.Created {
			s.fail("%s: created %v, model %v", o, sub.Created, created)
		}
	case opHold:
		s.expect(o, h.client.Hold(ctx, o.id), m.hold(o.id))
	case opRelease:
		s.expect(o, h.client.Release(ctx, o.id), m.release(o.id))
	case opRetry:
		s.expect(o, h.client.Retry(ctx, o.id), m.retry(o.id))
	case opRewind:
		s.expect(o, h.client.Rewind(ctx, o.id, o.step), m.rewind(o.id, o.step))
	case opFork:
		sub, err := h.client.Fork(ctx, o.id, o.step, o.newID)
		want := m.fork(o.id, o.step, o.newID)
		s.expect(o, err, want)
		if err == nil && !sub.Created {
			s.fail("%s: not created", o)
		}
	case opRemove:
		if t := m.tasks[o.id]; t != nil && t.phase == phaseRunning {
			// A removed run is fenced out at its next write; until it sees
			// that, it may overlap the next run of its group.
			if _, err := h.pool.Exec(ctx, `UPDATE model_run SET removed = true WHERE task_id = $1 AND ended IS NULL`, string(o.id)); err != nil {
				s.fail("mark removed runs: %v", err)
			}
		}
		s.expect(o, h.client.Remove(ctx, o.id), m.remove(o.id))
	case opHoldGroup:
		s.expect(o, h.client.HoldGroup(ctx, o.group), nil)
		m.heldGroups[o.group] = true
	case opReleaseGroup:
		s.expect(o, h.client.ReleaseGroup(ctx, o.group), nil)
		delete(m.heldGroups, o.group)
	case opPause:
		s.expect(o, h.client.Pause(ctx, o.behavior), nil)
		m.paused[o.behavior] = true
	case opResume:
		s.expect(o, h.client.Resume(ctx, o.behavior), nil)
		delete(m.paused, o.behavior)
	case opSignal:
		var opts []api.SignalOption
		if o.key != "" {
			opts = append(opts, api.SignalKey(o.key))
		}
		err := h.client.Signal(ctx, o.id, signalTopic, o.payload, opts...)
		s.expectSignals(o, err, []sigReq{{id: o.id, payload: o.payload, key: o.key}})
	case opSignalMany:
		reqs := make([]api.SignalRequest, len(o.reqs))
		for i, r := range o.reqs {
			reqs[i] = api.SignalRequest{ID: r.id, Topic: signalTopic, Payload: r.payload, Key: r.key}
		}
		s.expectSignals(o, h.client.SignalMany(ctx, reqs), o.reqs)
	case opFinish:
		if !s.finish(o) {
			return
		}
	case opStopNode:
		if !slices.Contains(m.nodes, o.node) || strings.HasPrefix(o.node, "proc") {
			s.t.Logf("replay: %s does not apply (no such in-process node); skipped", o)
			return
		}
		s.dropNode(o, h.abandonNode, m.lost)
	case opKillNode:
		if _, ok := h.procs[o.node]; !ok {
			s.t.Logf("replay: %s does not apply (no such child node); skipped", o)
			return
		}
		s.dropNode(o, h.killChild, m.takenOver)
	case opStartNode:
		s.startNode()
	case opStartChild:
		s.m.nodes = append(s.m.nodes, h.startChild(s.t))
	default:
		s.fail("unknown operation %q", o.kind)
	}
	s.settle(o)
	s.check(o)
}

// finish tells the run of a running task how to end, waits until it
// returned, checks what it received against the model's mailbox, and
// applies the end to the model. It reports false when the task does not
// run (a replayed op that no longer applies).
func (s *sequence) finish(o op) bool {
	s.t.Helper()
	t := s.m.tasks[o.id]
	if t == nil || t.phase != phaseRunning {
		s.t.Logf("replay: %s does not apply (task not running); skipped", o)
		return false
	}
	var children []api.TaskID
	for range o.children {
		s.children++
		children = append(children, api.TaskID(fmt.Sprintf("ch-%d", s.children)))
	}
	open, err := s.h.openRuns(s.ctx)
	if err != nil {
		s.fail("read open runs: %v", err)
	}
	runs := open[runKey{id: t.id, attempt: t.attempt, node: t.node}]
	if len(runs) != 1 {
		s.fail("%s: %d runs of %s wait, want 1", o, len(runs), t)
	}
	instructed, err := s.h.instruct(s.ctx, runs[0], o.run, children)
	if err != nil {
		s.fail("%s: %v", o, err)
	}
	if !instructed {
		// The run lost its lease before it read the instruction: the
		// task is taken over and runs again (settle adopts that run).
		s.t.Logf("%s: the run lost its lease first; its task is taken over", o)
		s.m.takenOver(o.id)
		return true
	}
	if o.run == runSleep || o.run == runReceiveFail {
		var received []int
		if err := s.h.pool.QueryRow(s.ctx, `SELECT received FROM model_run WHERE id = $1`, runs[0]).Scan(&received); err != nil {
			s.fail("%s: read what run %d received: %v", o, runs[0], err)
		}
		if !slices.Equal(received, t.mailbox) {
			s.fail("%s: the run received %v, model %v", o, received, t.mailbox)
		}
	}
	s.m.finish(o.id, o.run, children)
	return true
}

// dropNode ends node o.node with end and applies lost to the model's
// tasks that ran there; then it keeps two nodes running.
func (s *sequence) dropNode(o op, end func(string) error, lost func(api.TaskID)) {
	s.t.Helper()
	if err := end(o.node); err != nil {
		s.fail("%s: %v", o, err)
	}
	s.m.nodes = slices.DeleteFunc(s.m.nodes, func(n string) bool { return n == o.node })
	for _, id := range s.m.sortedIDs() {
		if t := s.m.tasks[id]; t.phase == phaseRunning && t.node == o.node {
			lost(id)
		}
	}
	s.keepNodes()
}

// settle waits until the system reaches a state the model allows after o:
// every run of a running task waits for the test, every run of a task no
// longer running has returned, and every task the model says may run
// does, caps permitting. Then the model adopts the runs the system
// started (which of the due tasks a capped claim takes is the system's
// choice).
func (s *sequence) settle(o op) {
	s.t.Helper()
	deadline := time.Now().Add(settleBound)
	var why string
	for {
		var ok bool
		ok, why = s.settled()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			s.fail("after %s: not settled within %s (2 leases + 10 polls): %s", o, settleBound, why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *sequence) settled() (bool, string) {
	stored, err := s.h.tasks(s.ctx)
	if err != nil {
		return false, "list tasks: " + err.Error()
	}
	runs, err := s.h.openRuns(s.ctx)
	if err != nil {
		return false, "read open runs: " + err.Error()
	}
	lost, err := s.h.lostRuns(s.ctx)
	if err != nil {
		return false, "read lost runs: " + err.Error()
	}
	// A run the engine ended on a live node, before the test told it how
	// to end, lost its lease (a renewal came too late on a loaded
	// machine): its task is taken over, an attempt spent, as the engine
	// promises.
	for _, id := range s.m.sortedIDs() {
		if t := s.m.tasks[id]; t.phase == phaseRunning && lost[runKey{id: id, attempt: t.attempt, node: t.node}] {
			s.t.Logf("run of %s (attempt %d on %s) lost its lease; its task is taken over", id, t.attempt, t.node)
			s.m.takenOver(id)
		}
	}
	for _, id := range sortedKeys(stored) {
		t := stored[id]
		if t.Status == api.StatusRunning && len(runs[runKey{id: t.ID, attempt: t.Attempt, node: t.Node}]) == 0 {
			return false, fmt.Sprintf("task %s runs (attempt %d on %s) but no run of it waits", t.ID, t.Attempt, t.Node)
		}
	}
	for k := range runs {
		t, ok := stored[k.id]
		if !ok || t.Status != api.StatusRunning || t.Attempt != k.attempt || t.Node != k.node {
			return false, fmt.Sprintf("run %v still goes, its task is %s", k, t.Status)
		}
	}
	// Adopt the runs the system started into a copy of the model's
	// running set, then demand that no task the model lets run waits.
	m := s.m
	now := time.Now()
	for _, id := range sortedKeys(stored) {
		st := stored[id]
		mt := m.tasks[id]
		if mt != nil && mt.phase == phaseWaiting && len(mt.dueAlt) > 0 && st.Status != api.StatusRunning && st.Status != api.StatusHeld {
			if d := dueOf(st.ScheduleNotBefore, now); slices.Contains(mt.dueAlt, d) {
				mt.due, mt.dueAlt = d, nil
			}
		}
		if st.Status != api.StatusRunning || mt == nil || mt.phase == phaseRunning {
			continue
		}
		if !m.claimable(mt) {
			return true, "" // a divergence: check reports it
		}
		// A run ends any wait for children: the run decides again.
		mt.phase, mt.node, mt.dueAlt, mt.waiting = phaseRunning, st.Node, nil, false
		mt.attempt++
		mt.steps = append(mt.steps, mt.attempt) // the run's checkpoint, with its log
		mt.event = mt.attempt                   // and its event
		m.starts[id]++
	}
	for _, id := range m.sortedIDs() {
		mt := m.tasks[id]
		if m.claimable(mt) && !m.capBlocked(mt) {
			return false, fmt.Sprintf("task %s may run and does not", mt)
		}
	}
	return true, ""
}

func sortedKeys[V any](m map[api.TaskID]V) []api.TaskID {
	out := make([]api.TaskID, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// check compares the stored state with the model and the run log with the
// caps.
func (s *sequence) check(o op) {
	s.t.Helper()
	if errs := s.h.takeErrors(); len(errs) > 0 {
		s.fail("after %s: runs saw errors: %s", o, strings.Join(errs, "; "))
	}
	stored, err := s.h.tasks(s.ctx)
	if err != nil {
		s.fail("list tasks: %v", err)
	}
	now := time.Now()
	var diffs []string
	for _, id := range sortedKeys(stored) {
		mt := s.m.tasks[id]
		if mt == nil {
			diffs = append(diffs, fmt.Sprintf("%s: stored (%s), not in the model", id, stored[id].Status))
			continue
		}
		for _, d := range mt.compare(stored[id], now) {
			diffs = append(diffs, fmt.Sprintf("%s: %s", id, d))
		}
	}
	for _, id := range s.m.sortedIDs() {
		if _, ok := stored[id]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: in the model (%s), not stored", id, s.m.tasks[id]))
		}
	}
	if len(diffs) > 0 {
		s.fail("after %s the stored state differs from the model:\n  %s", o, strings.Join(diffs, "\n  "))
	}
	s.checkSteps(o)
	s.checkMailboxes(o)
	held, err := s.h.client.HeldGroups(s.ctx)
	if err != nil {
		s.fail("held groups: %v", err)
	}
	if want := keys(s.m.heldGroups); !slices.Equal(held, want) && !(len(held) == 0 && len(want) == 0) {
		s.fail("after %s: held groups %v, model %v", o, held, want)
	}
	s.checkRunLog(o)
}

// checkMailboxes checks the messages no run consumed against the model's
// mailboxes: each task's, in the order sent, and none of a task that is
// gone; and each task's event against the model's.
func (s *sequence) checkMailboxes(o op) {
	s.t.Helper()
	rows, err := s.h.pool.Query(s.ctx, `SELECT s.task_id, array_agg(s.payload::int ORDER BY s.seq)
		FROM stint_signal s JOIN stint_task t ON t.id = s.task_id AND t.created_at = s.created
		WHERE s.consumed_at IS NULL GROUP BY s.task_id`)
	if err != nil {
		s.fail("read mailboxes: %v", err)
	}
	stored := map[api.TaskID][]int{}
	var id string
	var payloads []int
	if _, err := pgx.ForEachRow(rows, []any{&id, &payloads}, func() error {
		stored[api.TaskID(id)] = slices.Clone(payloads)
		return nil
	}); err != nil {
		s.fail("read mailboxes: %v", err)
	}
	for _, id := range s.m.sortedIDs() {
		if want := s.m.tasks[id].mailbox; !slices.Equal(stored[id], want) {
			s.fail("after %s: %s has unconsumed messages %v, model %v", o, id, stored[id], want)
		}
		delete(stored, id)
	}
	for id, got := range stored {
		s.fail("after %s: %s is gone but has unconsumed messages %v", o, id, got)
	}
	rows, err = s.h.pool.Query(s.ctx, `SELECT e.task_id, e.value::int
		FROM stint_event e JOIN stint_task t ON t.id = e.task_id AND t.created_at = e.created WHERE e.key = 'attempt'`)
	if err != nil {
		s.fail("read events: %v", err)
	}
	events := map[api.TaskID]int{}
	var value int
	if _, err := pgx.ForEachRow(rows, []any{&id, &value}, func() error {
		events[api.TaskID(id)] = value
		return nil
	}); err != nil {
		s.fail("read events: %v", err)
	}
	for _, id := range s.m.sortedIDs() {
		if got, want := events[id], s.m.tasks[id].event; got != want {
			s.fail("after %s: %s has event attempt=%d, model %d", o, id, got, want)
		}
	}
}

// checkSteps checks the steps kept of each task against the model's: as
// many as it counts, numbered from 1 without a gap, each with its
// progress; and no step of a task that is gone.
func (s *sequence) checkSteps(o op) {
	s.t.Helper()
	rows, err := s.h.pool.Query(s.ctx, `SELECT t.id, coalesce(t.step, 0),
		coalesce(array_agg(s.progress::text::int ORDER BY s.step) FILTER (WHERE s.step IS NOT NULL), '{}'),
		coalesce(array_agg(s.step ORDER BY s.step) FILTER (WHERE s.step IS NOT NULL), '{}')
		FROM stint_task t LEFT JOIN stint_step s ON s.task_id = t.id AND s.step <= coalesce(t.step, 0)
		GROUP BY t.id`)
	if err != nil {
		s.fail("read steps: %v", err)
	}
	var id string
	var last int
	var progress, numbers []int
	kept := 0
	_, err = pgx.ForEachRow(rows, []any{&id, &last, &progress, &numbers}, func() error {
		mt := s.m.tasks[api.TaskID(id)]
		if mt == nil {
			return nil // check reports it
		}
		want := make([]int, len(mt.steps))
		for i := range want {
			want[i] = i + 1
		}
		if last != len(mt.steps) || !slices.Equal(numbers, want) || !slices.Equal(progress, mt.steps) {
			s.fail("after %s: %s has steps %v (last %d) of progress %v, the model %v", o, id, numbers, last, progress, mt.steps)
		}
		kept += len(mt.steps)
		return nil
	})
	if err != nil {
		s.fail("read steps: %v", err)
	}
	var all int
	if err := s.h.pool.QueryRow(s.ctx, `SELECT count(*) FROM stint_step`).Scan(&all); err != nil {
		s.fail("count steps: %v", err)
	}
	if all != kept {
		s.fail("after %s: %d steps are stored, the tasks have %d: steps outlived their tasks", o, all, kept)
	}
}

// checkRunLog checks the run log: as many runs per task as the model
// counted (none lost, none extra), and no caps exceeded at any time.
func (s *sequence) checkRunLog(o op) {
	s.t.Helper()
	rows, err := s.h.pool.Query(s.ctx, `SELECT task_id, count(*) FROM model_run GROUP BY task_id`)
	if err != nil {
		s.fail("read run log: %v", err)
	}
	logged := map[api.TaskID]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			s.fail("read run log: %v", err)
		}
		logged[api.TaskID(id)] = n
	}
	if err := rows.Err(); err != nil {
		s.fail("read run log: %v", err)
	}
	for id, n := range s.m.starts {
		if logged[id] != n {
			s.fail("after %s: %s ran %d times by the run log, the model counted %d starts", o, id, logged[id], n)
		}
	}
	for id, n := range logged {
		if s.m.starts[id] == 0 {
			s.fail("after %s: %s ran %d times by the run log, the model counted none", o, id, n)
		}
	}
	// Overlap of two runs: each started before the other ended.
	const overlap = `a.id < b.id AND a.started < coalesce(b.ended, 'infinity') AND b.started < coalesce(a.ended, 'infinity')`
	var what string
	err = s.h.pool.QueryRow(s.ctx, `
		SELECT format('runs %s (attempt %s on %s) and %s (attempt %s on %s) of task %s overlap', a.id, a.attempt, a.node, b.id, b.attempt, b.node, a.task_id)
		FROM model_run a JOIN model_run b ON a.task_id = b.task_id AND `+overlap+`
		WHERE NOT a.removed AND NOT b.removed LIMIT 1`).Scan(&what)
	if err == nil {
		s.fail("after %s: a task ran twice at once: %s", o, what)
	}
	err = s.h.pool.QueryRow(s.ctx, `
		SELECT format('runs %s and %s of group %s overlap (cap %s)', a.id, b.id, a.group_key, $2::int) FROM model_run a JOIN model_run b
		ON a.behavior = b.behavior AND a.group_key = b.group_key AND `+overlap+`
		WHERE a.behavior = $1 AND a.group_key <> '' AND NOT a.removed AND NOT b.removed LIMIT 1`,
		string(behShare.id), behShare.groupCap).Scan(&what)
	if err == nil {
		s.fail("after %s: group cap exceeded: %s", o, what)
	}
	err = s.h.pool.QueryRow(s.ctx, `
		SELECT format('run %s on %s overlaps %s runs of %s', a.id, a.node, count(*), a.behavior) FROM model_run a JOIN model_run b
		ON a.node = b.node AND (a.behavior = b.behavior OR $1 = '') AND b.started <= a.started AND a.started < coalesce(b.ended, 'infinity')
		WHERE $1 = '' OR a.behavior = $1
		GROUP BY a.id HAVING count(*) > $2 LIMIT 1`, string(behShare.id), behShare.nodeCap).Scan(&what)
	if err == nil {
		s.fail("after %s: per-node cap of %s exceeded: %s", o, behShare.id, what)
	}
	err = s.h.pool.QueryRow(s.ctx, `
		SELECT format('run %s on %s overlaps %s runs', a.id, a.node, count(*)) FROM model_run a JOIN model_run b
		ON a.node = b.node AND b.started <= a.started AND a.started < coalesce(b.ended, 'infinity')
		GROUP BY a.id HAVING count(*) > $1 LIMIT 1`, maxWorkers).Scan(&what)
	if err == nil {
		s.fail("after %s: node worker limit exceeded: %s", o, what)
	}
}

// drain ends a sequence: it lifts group holds and pauses, then lets every
// run succeed until nothing runs. Every task must then be finished, held,
// or due in the future.
func (s *sequence) drain() {
	s.t.Helper()
	for _, g := range keys(s.m.heldGroups) {
		s.step(op{kind: opReleaseGroup, group: g})
	}
	for _, b := range keys(s.m.paused) {
		s.step(op{kind: opResume, behavior: b})
	}
	for range 500 {
		var running *mtask
		for _, id := range s.m.sortedIDs() {
			if t := s.m.tasks[id]; t.phase == phaseRunning {
				running = t
				break
			}
		}
		if running == nil {
			break
		}
		s.step(op{kind: opFinish, id: running.id, run: runSuccess})
	}
	for _, id := range s.m.sortedIDs() {
		t := s.m.tasks[id]
		switch {
		case t.phase == phaseSuccess, t.phase == phaseFailure, t.phase == phaseHeld:
		case t.phase == phaseWaiting && t.due == dueFuture:
		default:
			s.fail("after the drain, %s neither ended nor is held nor waits for a later time", t)
		}
	}
}
