package modeltest

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/stinthq/stint/api"
)

// due is a due time as the model knows it: not at all, now (or within a
// short backoff, which is as good as now), or far in the future (a delay
// or backoff of about an hour, which no sequence outlives).
type due int

const (
	dueNone due = iota
	dueNow
	dueFuture
)

func (d due) String() string { return [...]string{"none", "now", "future"}[d] }

// phase is the part of a task's state the model tracks exactly. A task
// that waits to run (scheduled, or succeeded or failed with a due time)
// is phaseWaiting whatever its stored status: the status of a waiting
// task is what its last run did, which the model keeps in errors.
type phase int

const (
	phaseWaiting phase = iota
	phaseRunning
	phaseHeld
	phaseSuccess // finished for good
	phaseFailure // finished for good
)

func (p phase) String() string {
	return [...]string{"waiting", "running", "held", "success", "failure"}[p]
}

// behaviorSpec is what the model knows of a test behavior's policy.
type behaviorSpec struct {
	id          api.BehaviorID
	share       bool // spi.DedupShare
	maxAttempts int
	longBackoff bool // retries wait about an hour
	groupCap    int  // spi.Policy.GroupConcurrency
	nodeCap     int  // spi.Policy.MaxConcurrency
	reopen      bool // spi.Policy.ReopenOnSignal
}

// The test behaviors.
var (
	behPlain = behaviorSpec{id: "model.plain", maxAttempts: 3, reopen: true}
	behShare = behaviorSpec{id: "model.share", share: true, maxAttempts: 3, groupCap: 1, nodeCap: 2}
	behSlow  = behaviorSpec{id: "model.slow", maxAttempts: 2, longBackoff: true}
	specs    = []behaviorSpec{behPlain, behShare, behSlow}
)

func spec(b api.BehaviorID) behaviorSpec {
	for _, s := range specs {
		if s.id == b {
			return s
		}
	}
	panic("unknown behavior " + b)
}

// mtask is the model of one task.
type mtask struct {
	id       api.TaskID
	behavior api.BehaviorID
	group    string
	parent   api.TaskID
	// life numbers the task's creation (a removed id submitted again is a
	// new life); parentLife is the life of the parent that spawned it.
	life, parentLife int
	phase            phase
	due              due   // of a waiting task
	dueAlt           []due // when set, the stored due may be any of these (the model adopts it)
	held             due   // the due time a held task goes back to on release
	heldAlt          []due // like dueAlt, for held
	attempt          int
	errors           int
	resubmit         bool
	resubmitDue      due    // the due time the last resubmit during a run asked for
	node             string // of a running task
	pending          int    // children not ended
	waiting          bool   // waits for its children
	// heldChildrenEnded is set when the last child of a held waiting
	// parent ended: released, it is due at once.
	heldChildrenEnded bool
	// steps are the progress of the task's steps (spi.Policy.KeepSteps),
	// by number: each run checkpoints its attempt as it starts.
	steps []int
	// mailbox holds the payloads of the signals sent to the task that no
	// run consumed, oldest first.
	mailbox []int
	// keys are the idempotency keys of the messages stored for the task,
	// consumed or not, in the order first stored: a message with one of
	// them stores nothing.
	keys []string
	// sleeping is set while the task sleeps on the signal topic (its last
	// run returned spi.WaitForSignal): a signal makes it due.
	sleeping bool
	// event is the value of the task's event "attempt", which each run
	// sets to its attempt as it starts (0: none): it outlives the runs
	// and goes with the task.
	event int
}

// model is the reference state machine.
type model struct {
	tasks      map[api.TaskID]*mtask
	heldGroups map[string]bool
	paused     map[api.BehaviorID]bool
	nodes      []string // live nodes
	lives      int      // tasks created, to number their lives
	maxWorkers int
	// starts counts the runs of each task id that started, over all its
	// lives: the run log must hold exactly as many.
	starts map[api.TaskID]int
	// reopens counts the tasks signals reopened.
	reopens int
}

func newModel(maxWorkers int) *model {
	return &model{tasks: map[api.TaskID]*mtask{}, heldGroups: map[string]bool{}, paused: map[api.BehaviorID]bool{},
		maxWorkers: maxWorkers, starts: map[api.TaskID]int{}}
}

// outcome of an api call: nil, api.ErrNotFound or api.ErrConflict.
type outcome = error

func (m *model) submit(b api.BehaviorID, id api.TaskID, group string, d due) (created bool) {
	t := m.tasks[id]
	if t == nil {
		m.lives++
		m.tasks[id] = &mtask{id: id, behavior: b, group: group, phase: phaseWaiting, due: d, life: m.lives}
		return true
	}
	if spec(t.behavior).share {
		return false
	}
	switch t.phase {
	case phaseWaiting:
		if t.errors > 0 {
			// Waiting to retry: attempts and errors stay, so that
			// resubmits cannot defeat MaxAttempts and backoff. The due
			// time is the submit's or the backoff's.
			t.dueAlt = []due{t.due, d}
		}
		t.due = d
	case phaseRunning:
		t.resubmit, t.resubmitDue = true, d
	case phaseHeld:
		t.heldAlt = []due{t.held, d}
	case phaseSuccess, phaseFailure:
		t.phase, t.due, t.attempt, t.errors = phaseWaiting, d, 0, 0
	}
	return false
}

// debounce applies a debounced submit due at d (see debounceWindow). A
// behavior that shares its tasks refuses it; otherwise it is a submit at
// d, except that a held task keeps its due time.
func (m *model) debounce(b api.BehaviorID, id api.TaskID, group string, d due) (created bool, _ outcome) {
	if spec(b).share {
		return false, api.ErrInvalid
	}
	if t := m.tasks[id]; t != nil && t.phase == phaseHeld {
		return false, nil
	}
	return m.submit(b, id, group, d), nil
}

func (m *model) hold(id api.TaskID) outcome {
	t := m.tasks[id]
	if t == nil {
		return api.ErrNotFound
	}
	if t.phase != phaseWaiting {
		return api.ErrConflict
	}
	t.phase, t.held, t.heldAlt = phaseHeld, t.due, t.dueAlt
	t.dueAlt = nil
	return nil
}

func (m *model) release(id api.TaskID) outcome {
	t := m.tasks[id]
	if t == nil {
		return api.ErrNotFound
	}
	if t.phase != phaseHeld {
		return api.ErrConflict
	}
	t.phase, t.due, t.dueAlt = phaseWaiting, t.held, t.heldAlt
	if t.waiting && (t.pending == 0 || t.heldChildrenEnded) {
		t.waiting, t.due, t.dueAlt = false, dueNow, nil
	}
	t.heldChildrenEnded = false
	return nil
}

func (m *model) retry(id api.TaskID) outcome {
	t := m.tasks[id]
	if t == nil {
		return api.ErrNotFound
	}
	if t.phase != phaseFailure {
		return api.ErrConflict
	}
	t.phase, t.due, t.attempt, t.errors = phaseWaiting, dueNow, 0, 0
	if p := m.tasks[t.parent]; p != nil && p.life == t.parentLife {
		// A retried child has not ended any more: it is pending again, and
		// its next end is counted once. A parent its first end already
		// woke (or, held, would wake on release) stays woken; when it waits
		// for its children again, it waits for this one too.
		p.pending++
	}
	return nil
}

// rewind runs the task id that finished for good again from its step k
// (Operator.Rewind): as a retry, with its steps after k dropped.
func (m *model) rewind(id api.TaskID, k int) outcome {
	t := m.tasks[id]
	switch {
	case k < 1:
		return api.ErrInvalid
	case t == nil:
		return api.ErrNotFound
	case t.phase != phaseSuccess && t.phase != phaseFailure:
		return api.ErrConflict
	case k > len(t.steps):
		return api.ErrNotFound
	}
	t.phase, t.due, t.attempt, t.errors, t.steps = phaseWaiting, dueNow, 0, 0, t.steps[:k]
	if p := m.tasks[t.parent]; p != nil && p.life == t.parentLife {
		p.pending++ // as for a retried child
	}
	return nil
}

// fork stores newID, a copy of task id from its step k (Operator.Fork):
// its behavior and group, its steps up to k, due now, top-level.
func (m *model) fork(id api.TaskID, k int, newID api.TaskID) outcome {
	t := m.tasks[id]
	switch {
	case k < 1:
		return api.ErrInvalid
	case t == nil:
		return api.ErrNotFound
	case t.phase == phaseRunning:
		return api.ErrConflict
	case k > len(t.steps):
		return api.ErrNotFound
	case m.tasks[newID] != nil:
		return api.ErrConflict
	}
	m.lives++
	m.tasks[newID] = &mtask{id: newID, behavior: t.behavior, group: t.group, phase: phaseWaiting, due: dueNow, life: m.lives,
		steps: slices.Clone(t.steps[:k])}
	return nil
}

// signalMany sends the messages of reqs (a signal sends one), all or
// none: a message to a task that does not exist is refused, one to a task
// that finished for good conflicts unless the task reopens (its behavior
// reopens and it has no parent), and the first refusal refuses the call.
// Otherwise each message is stored in order, except one whose key its
// task has seen (of two in reqs, the first is stored). A task asleep on
// the topic that got a message is due at once, or, held, at its release;
// a finished one is reopened. It returns the number of messages stored.
func (m *model) signalMany(reqs []sigReq) (int, outcome) {
	for _, r := range reqs {
		t := m.tasks[r.id]
		switch {
		case t == nil:
			return 0, api.ErrNotFound
		case (t.phase == phaseSuccess || t.phase == phaseFailure) && (!spec(t.behavior).reopen || t.parent != ""):
			return 0, api.ErrConflict
		}
	}
	stored := 0
	for _, r := range reqs {
		t := m.tasks[r.id]
		if r.key != "" && slices.Contains(t.keys, r.key) {
			continue
		}
		if r.key != "" {
			t.keys = append(t.keys, r.key)
		}
		stored++
		t.mailbox = append(t.mailbox, r.payload)
		if t.phase == phaseSuccess || t.phase == phaseFailure {
			m.reopen(t)
			continue
		}
		if !t.sleeping {
			continue
		}
		switch t.phase {
		case phaseWaiting:
			t.sleeping, t.due, t.dueAlt = false, dueNow, nil
		case phaseHeld:
			t.sleeping, t.held, t.heldAlt = false, dueNow, nil
		}
	}
	return stored, nil
}

// reopen schedules task t, which finished for good and has no parent,
// again at once, as a resubmit does: attempts and errors reset.
func (m *model) reopen(t *mtask) {
	t.phase, t.due, t.dueAlt, t.attempt, t.errors = phaseWaiting, dueNow, nil, 0, 0
	m.reopens++
}

func (m *model) remove(id api.TaskID) outcome {
	t := m.tasks[id]
	if t == nil {
		return api.ErrNotFound
	}
	delete(m.tasks, id)
	if t.parent != "" && t.phase != phaseSuccess && t.phase != phaseFailure {
		m.childEnded(t)
	}
	// Its children become orphans: no parent, and their ends are counted
	// off nobody.
	for _, c := range m.tasks {
		if c.parent == id && c.parentLife == t.life {
			c.parent, c.parentLife = "", 0
		}
	}
	return nil
}

// childEnded counts the end of child c off its parent, waking it when it
// waited for its last child. A parent that was removed is gone for its
// children, even when a new task of its id was submitted since.
func (m *model) childEnded(c *mtask) {
	p := m.tasks[c.parent]
	if p == nil || p.life != c.parentLife {
		return
	}
	p.pending = max(p.pending-1, 0)
	if p.pending > 0 || !p.waiting {
		return
	}
	switch p.phase {
	case phaseWaiting:
		p.waiting, p.due, p.dueAlt = false, dueNow, nil
	case phaseHeld:
		p.heldChildrenEnded = true
	}
}

// runKind is how the test ends a run.
type runKind int

const (
	runSuccess runKind = iota
	runFailRetryable
	runFailPermanent
	runSpawn // spawn children, then wait for them
	// runSleep receives every message of the signal topic, then sleeps on
	// it for an hour (spi.WaitForSignal): what it received is consumed.
	runSleep
	// runReceiveFail receives every message of the topic, then fails
	// retryably: it consumes nothing.
	runReceiveFail
)

var runKindNames = []string{"success", "fail", "failperm", "spawn", "sleep", "recvfail"}

func (k runKind) String() string { return runKindNames[k] }

// finish applies the end of the running task id's run; children are the
// ids it spawned (runSpawn).
func (m *model) finish(id api.TaskID, k runKind, children []api.TaskID) {
	t := m.tasks[id]
	s := spec(t.behavior)
	t.node = ""
	t.dueAlt = nil
	t.sleeping = k == runSleep && !t.resubmit
	again := dueNone
	switch k {
	case runSuccess:
		t.phase, t.errors = phaseSuccess, 0
	case runSleep:
		// A sleep, like a snooze, is neither a failure nor an attempt.
		t.attempt--
		t.mailbox = nil
		t.phase, again = phaseWaiting, dueFuture
	case runFailRetryable, runFailPermanent, runReceiveFail:
		t.phase = phaseFailure
		t.errors++
		if k != runFailPermanent && t.attempt < s.maxAttempts {
			again = dueNow
			if s.longBackoff {
				again = dueFuture
			}
		}
	case runSpawn:
		// A wait for children is neither a failure nor an attempt.
		t.attempt--
		for _, c := range children {
			m.lives++
			m.tasks[c] = &mtask{id: c, behavior: behPlain.id, parent: id, parentLife: t.life, phase: phaseWaiting, due: dueNow, life: m.lives}
		}
		t.pending += len(children)
		t.phase, again = phaseWaiting, dueFuture
		t.waiting = t.pending > 0
		if !t.waiting {
			again = dueNow
		}
	}
	if t.resubmit {
		// The run again that the resubmit asked for, at the due time it
		// asked for; a wait for children still ends at their end.
		t.resubmit = false
		again = t.resubmitDue
	}
	if again != dueNone {
		t.phase, t.due = phaseWaiting, again
	} else {
		t.due = dueNone
		if t.parent != "" {
			m.childEnded(t)
		}
	}
}

// lost applies a run that ended without its end recorded: its node
// stopped and gave the task back. The run does not count as an attempt,
// and a resubmit during it is covered by the next run.
func (m *model) lost(id api.TaskID) {
	t := m.tasks[id]
	t.phase, t.due, t.node, t.resubmit = phaseWaiting, dueNow, "", false
	t.attempt--
}

// takenOver applies a run whose node died: its task is taken over once
// the lease expires, due again at once. The lost run counts as an
// attempt; a resubmit during it is covered by the next run.
func (m *model) takenOver(id api.TaskID) {
	t := m.tasks[id]
	t.phase, t.due, t.node, t.resubmit = phaseWaiting, dueNow, "", false
}

// claimable reports whether t may be claimed now, caps aside.
func (m *model) claimable(t *mtask) bool {
	return t.phase == phaseWaiting && t.due == dueNow && !m.paused[t.behavior] && (t.group == "" || !m.heldGroups[t.group])
}

// running counts the model's running tasks matching f.
func (m *model) running(f func(*mtask) bool) int {
	n := 0
	for _, t := range m.tasks {
		if t.phase == phaseRunning && f(t) {
			n++
		}
	}
	return n
}

// capBlocked reports whether the caps keep t from running now: on every
// live node its behavior or the node is full, or its group is full.
func (m *model) capBlocked(t *mtask) bool {
	s := spec(t.behavior)
	if s.groupCap > 0 && t.group != "" &&
		m.running(func(o *mtask) bool { return o.behavior == t.behavior && o.group == t.group }) >= s.groupCap {
		return true
	}
	for _, n := range m.nodes {
		if m.running(func(o *mtask) bool { return o.node == n }) >= m.maxWorkers {
			continue
		}
		if s.nodeCap > 0 && m.running(func(o *mtask) bool { return o.node == n && o.behavior == t.behavior }) >= s.nodeCap {
			continue
		}
		return false
	}
	return true
}

// sortedIDs returns the model's task ids in order.
func (m *model) sortedIDs() []api.TaskID {
	ids := make([]api.TaskID, 0, len(m.tasks))
	for id := range m.tasks {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// dueOf classifies a stored due time.
func dueOf(at *time.Time, now time.Time) due {
	switch {
	case at == nil:
		return dueNone
	case at.Before(now.Add(10 * time.Minute)):
		return dueNow
	default:
		return dueFuture
	}
}

// compare checks a stored task against the model's and, where the model
// allows a set of values, adopts the stored one. It returns what differs.
func (t *mtask) compare(s api.Task, now time.Time) []string {
	var diffs []string
	add := func(format string, args ...any) { diffs = append(diffs, fmt.Sprintf(format, args...)) }
	var ph phase
	switch {
	case s.Status == api.StatusRunning:
		ph = phaseRunning
	case s.Status == api.StatusHeld:
		ph = phaseHeld
	case s.Status == api.StatusScheduled || s.ScheduleNotBefore != nil || s.Resubmit:
		ph = phaseWaiting
	case s.Status == api.StatusSuccess:
		ph = phaseSuccess
	default:
		ph = phaseFailure
	}
	if ph != t.phase {
		add("phase %s (status %s), model %s", ph, s.Status, t.phase)
		return diffs
	}
	asleep := s.Waiting != nil && s.Waiting.Reason == api.WaitSignal
	if want := ph == phaseWaiting && t.sleeping && t.due == dueFuture; len(t.dueAlt) == 0 && asleep != want {
		add("asleep on a signal %v, model %v", asleep, want)
	}
	if ph == phaseWaiting {
		d := dueOf(s.ScheduleNotBefore, now)
		switch {
		case len(t.dueAlt) > 0 && slices.Contains(t.dueAlt, d):
			t.due, t.dueAlt = d, nil
		case d != t.due:
			add("due %s, model %s", d, t.due)
		}
	}
	if ph == phaseRunning && s.Node != t.node {
		add("node %s, model %s", s.Node, t.node)
	}
	if s.Behavior != t.behavior || s.GroupKey != t.group || s.ParentID != t.parent {
		add("behavior/group/parent %s/%s/%s, model %s/%s/%s", s.Behavior, s.GroupKey, s.ParentID, t.behavior, t.group, t.parent)
	}
	if s.Attempt != t.attempt {
		add("attempt %d, model %d", s.Attempt, t.attempt)
	}
	if s.Errors != t.errors {
		add("errors %d, model %d", s.Errors, t.errors)
	}
	// On a running task the flag says a submit came during the run; on a
	// waiting one the store keeps it to mark the next run as the
	// resubmitted one (RunContext.IsResubmitted), which the model does
	// not follow.
	if ph == phaseRunning && s.Resubmit != t.resubmit {
		add("resubmit %v, model %v", s.Resubmit, t.resubmit)
	}
	if s.ChildrenPending != t.pending {
		add("children pending %d, model %d", s.ChildrenPending, t.pending)
	}
	// The progress is the last step's: every checkpoint keeps a step.
	want := ""
	if len(t.steps) > 0 {
		want = strconv.Itoa(t.steps[len(t.steps)-1])
	}
	if string(s.Progress) != want {
		add("progress %s, model %q", s.Progress, want)
	}
	return diffs
}

func (t *mtask) String() string {
	s := fmt.Sprintf("%s[%s g=%q %s", t.id, t.behavior, t.group, t.phase)
	switch t.phase {
	case phaseWaiting:
		s += " due=" + t.due.String()
	case phaseHeld:
		s += " held-due=" + t.held.String()
	case phaseRunning:
		s += " on " + t.node
	}
	s += fmt.Sprintf(" attempt=%d errors=%d", t.attempt, t.errors)
	if t.resubmit {
		s += " resubmit"
	}
	if t.parent != "" {
		s += " parent=" + string(t.parent)
	}
	if t.pending > 0 || t.waiting {
		s += fmt.Sprintf(" pending=%d waiting=%v", t.pending, t.waiting)
	}
	if len(t.steps) > 0 {
		s += fmt.Sprintf(" steps=%v", t.steps)
	}
	if len(t.mailbox) > 0 {
		s += fmt.Sprintf(" mailbox=%v", t.mailbox)
	}
	if len(t.keys) > 0 {
		s += fmt.Sprintf(" keys=%v", t.keys)
	}
	if t.sleeping {
		s += " sleeping"
	}
	return s + "]"
}

// dump lists the model's tasks, for failure messages.
func (m *model) dump() string {
	var lines []string
	for _, id := range m.sortedIDs() {
		lines = append(lines, "  "+m.tasks[id].String())
	}
	sort.Strings(lines)
	out := fmt.Sprintf("nodes %v, held groups %v, paused %v\n", m.nodes, keys(m.heldGroups), keys(m.paused))
	for _, l := range lines {
		out += l + "\n"
	}
	return out
}

func keys[K ~string](m map[K]bool) []K {
	var out []K
	for k, v := range m {
		if v {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
