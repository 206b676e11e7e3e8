package modeltest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stinthq/stint/api"
)

// opKind is what an operation does.
type opKind string

const (
	opSubmit       opKind = "submit"
	opDebounce     opKind = "debounce" // a debounced submit (its window: debounceWindow)
	opHold         opKind = "hold"
	opRelease      opKind = "release"
	opHoldGroup    opKind = "holdgroup"
	opReleaseGroup opKind = "releasegroup"
	opPause        opKind = "pause"
	opResume       opKind = "resume"
	opRemove       opKind = "remove"
	opRetry        opKind = "retry"
	opRewind       opKind = "rewind"     // run a finished task again from a step
	opFork         opKind = "fork"       // copy a task from a step to a new id
	opFinish       opKind = "finish"     // end a waiting run
	opStopNode     opKind = "stopnode"   // abandon a node (its runs are cancelled and given back)
	opStartNode    opKind = "startnode"  // start one more node
	opStartChild   opKind = "startchild" // start a node in a child process
	opKillNode     opKind = "killnode"   // SIGKILL a child node
	opSignal       opKind = "signal"     // send a message of signalTopic to a task
	opSignalMany   opKind = "signalmany" // send messages of signalTopic to 2 or 3 tasks at once, all or none
)

// signalTopic is the topic of every signal of the sequences.
const signalTopic = "t"

// op is one step of a sequence. Its text form (String, parseOp) is what a
// failing sequence prints for replay.
type op struct {
	kind     opKind
	behavior api.BehaviorID
	id       api.TaskID
	group    string
	delay    bool // submit with a delay of an hour
	run      runKind
	children int
	node     string
	step     int        // of a rewind or a fork
	newID    api.TaskID // of a fork
	payload  int        // of a signal: unique in its sequence
	key      string     // of a signal: its idempotency key, "" for none
	reqs     []sigReq   // of a signalmany, in order
}

// sigReq is one message of a signalmany.
type sigReq struct {
	id      api.TaskID
	payload int    // unique in its sequence
	key     string // idempotency key, "" for none
}

func (o op) String() string {
	parts := []string{string(o.kind)}
	if o.behavior != "" {
		parts = append(parts, "b="+string(o.behavior))
	}
	if o.id != "" {
		parts = append(parts, "id="+string(o.id))
	}
	if o.group != "" {
		parts = append(parts, "g="+o.group)
	}
	if o.delay {
		parts = append(parts, "delay=1h")
	}
	if o.kind == opFinish {
		parts = append(parts, "run="+o.run.String())
		if o.run == runSpawn {
			parts = append(parts, "children="+strconv.Itoa(o.children))
		}
	}
	if o.node != "" {
		parts = append(parts, "node="+o.node)
	}
	if o.kind == opRewind || o.kind == opFork {
		parts = append(parts, "step="+strconv.Itoa(o.step))
	}
	if o.newID != "" {
		parts = append(parts, "new="+string(o.newID))
	}
	if o.kind == opSignal {
		parts = append(parts, "p="+strconv.Itoa(o.payload))
	}
	if o.key != "" {
		parts = append(parts, "k="+o.key)
	}
	if len(o.reqs) > 0 {
		var rs []string
		for _, r := range o.reqs {
			f := string(r.id) + ":" + strconv.Itoa(r.payload)
			if r.key != "" {
				f += ":" + r.key
			}
			rs = append(rs, f)
		}
		parts = append(parts, "to="+strings.Join(rs, ","))
	}
	return strings.Join(parts, " ")
}

// parseOps reads ops in their text form, separated by ';' or newlines.
func parseOps(s string) ([]op, error) {
	var out []op
	for _, line := range strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == '\n' }) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		o := op{kind: opKind(f[0])}
		for _, kv := range f[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, fmt.Errorf("op %q: %q is not key=value", line, kv)
			}
			switch k {
			case "b":
				o.behavior = api.BehaviorID(v)
			case "id":
				o.id = api.TaskID(v)
			case "g":
				o.group = v
			case "delay":
				o.delay = true
			case "run":
				i := slices.Index(runKindNames, v)
				if i < 0 {
					return nil, fmt.Errorf("op %q: unknown run outcome %q", line, v)
				}
				o.run = runKind(i)
			case "children":
				n, err := strconv.Atoi(v)
				if err != nil {
					return nil, fmt.Errorf("op %q: %w", line, err)
				}
				o.children = n
			case "node":
				o.node = v
			case "step":
				n, err := strconv.Atoi(v)
				if err != nil {
					return nil, fmt.Errorf("op %q: %w", line, err)
				}
				o.step = n
			case "new":
				o.newID = api.TaskID(v)
			case "p":
				n, err := strconv.Atoi(v)
				if err != nil {
					return nil, fmt.Errorf("op %q: %w", line, err)
				}
				o.payload = n
			case "k":
				o.key = v
			case "to":
				for _, f := range strings.Split(v, ",") {
					r, err := parseSigReq(f)
					if err != nil {
						return nil, fmt.Errorf("op %q: %w", line, err)
					}
					o.reqs = append(o.reqs, r)
				}
			default:
				return nil, fmt.Errorf("op %q: unknown key %q", line, k)
			}
		}
		out = append(out, o)
	}
	return out, nil
}

// parseSigReq reads a message of a signalmany: id:payload or
// id:payload:key.
func parseSigReq(s string) (sigReq, error) {
	f := strings.Split(s, ":")
	if len(f) < 2 || len(f) > 3 {
		return sigReq{}, fmt.Errorf("message %q is not id:payload[:key]", s)
	}
	n, err := strconv.Atoi(f[1])
	if err != nil {
		return sigReq{}, fmt.Errorf("message %q: %w", s, err)
	}
	r := sigReq{id: api.TaskID(f[0]), payload: n}
	if len(f) == 3 {
		r.key = f[2]
	}
	return r, nil
}

// Defects of the engine this test has known, all fixed now; each has a
// replay in TestDefects. A switch (-model.defects) leaves out the
// operations that reach its defect, for the time a new defect is being
// fixed. The model always encodes the intended semantics.
const (
	// defectHoldWaitingParent: holding a parent that waits for its
	// children makes the finish of its last child fail (the held row must
	// not get a due time) and poisons the child's completion batch.
	defectHoldWaitingParent = "hold-waiting-parent"
	// defectResubmitRetryWait: a submit of a task that waits to retry
	// resets its attempt and error counts.
	defectResubmitRetryWait = "resubmit-retry-wait"
	// defectReleaseDropsDue: release makes a held task due at once
	// instead of at the due time it had.
	defectReleaseDropsDue = "release-drops-due"
	// defectLostRunKeepsResubmit: a run given back by a stopping node
	// keeps the resubmit flag, so the task runs once more than asked.
	defectLostRunKeepsResubmit = "lost-run-keeps-resubmit"
)

// defectRetriedChildNotPending (found by this test): a child that failed
// for good is counted off its parent; Retry runs it again without
// counting it as pending again, and its next end is counted off the
// parent once more. The parent is woken while a child it spawned later
// still runs, or never waits for the retried child at all.
const defectRetriedChildNotPending = "retried-child-not-pending"

// defectOrphanChildCountsOffNewParent (found by this test): the end of a
// child whose parent was removed is counted off a new task submitted
// since under the parent's id, which may wake it while its own children
// still run.
const defectOrphanChildCountsOffNewParent = "orphan-child-counts-off-new-parent"

// defectClaimLostAfterStop (found by this test, cause not yet known): a
// task made due (submit, release of its group) just after a node was
// stopped with its runs abandoned was claimed (attempt 1) without any run
// starting, and ran only after its lease expired and another node took
// it over (attempt 2). Seen three times in about 440 sequences; its
// replays passed. The switch leaves out operations that make tasks due
// right after a stop.
const defectClaimLostAfterStop = "claim-lost-after-stop"

// defectReopenedChildNotPending: a signal reopened a child that finished
// for good (spi.Policy.ReopenOnSignal) without counting it pending on its
// parent again, as Retry and Rewind do, so its next end was counted off
// the parent once more, waking it while a sibling still ran. Fixed: a
// signal never reopens a child. The switch leaves out signals to a
// finished child of a live parent.
const defectReopenedChildNotPending = "reopened-child-not-pending"

var allDefects = []string{defectHoldWaitingParent, defectResubmitRetryWait, defectReleaseDropsDue, defectLostRunKeepsResubmit,
	defectRetriedChildNotPending, defectOrphanChildCountsOffNewParent, defectClaimLostAfterStop, defectReopenedChildNotPending}

// Task ids the generator draws from: few per behavior, so that submits
// collide. The group key of a pool id is fixed by its number, so that a
// resubmit never asks for another group.
var pool = map[api.BehaviorID][]api.TaskID{
	behPlain.id: {"pl-1", "pl-2", "pl-3", "pl-4"},
	behShare.id: {"sh-1", "sh-2", "sh-3", "sh-4", "sh-5"},
	behSlow.id:  {"sl-1", "sl-2", "sl-3"},
}

var groupKeys = []string{"g1", "g2"}

// forkIDs are the new ids forks draw from, besides the ids that hold
// tasks: a fork copies its source's behavior and group key, so that no
// submit goes to them.
var forkIDs = []api.TaskID{"fk-1", "fk-2", "fk-3"}

// debounceWindow returns the window and maximum wait of the debounced
// submits of a pool id: an hour and two for an even number (the task is
// due far in the future), a millisecond for an odd one (due now). One
// length per id keeps the model exact: a cycle of short submits is due
// now whether it ended or not, one of long submits an hour away.
func debounceWindow(id api.TaskID) (window, maxWait time.Duration) {
	if n, _ := strconv.Atoi(string(id[len(id)-1:])); n%2 == 0 {
		return time.Hour, 2 * time.Hour
	}
	return time.Millisecond, time.Millisecond
}

func poolGroup(id api.TaskID) string {
	n, _ := strconv.Atoi(string(id[len(id)-1:]))
	return []string{"", "g1", "g2"}[n%3]
}

// generator draws operations that the model's state makes interesting.
type generator struct {
	rng     *rand.Rand
	defects map[string]bool
	// maxNodes caps the live nodes.
	maxNodes int
	// excluded counts the operations left out per defect switch.
	excluded map[string]int
	// children allows nodes in child processes (killed with SIGKILL).
	children bool
	last     opKind // the previous operation's
	signals  int    // the signals drawn, which number their payloads
}

func (g *generator) pick(n int) int { return g.rng.IntN(n) }

// next returns the next operation for model m.
func (g *generator) next(m *model) op {
	for {
		o, ok := g.try(m)
		makesDue := o.kind == opSubmit || o.kind == opDebounce || o.kind == opRelease || o.kind == opReleaseGroup || o.kind == opResume ||
			o.kind == opRetry || o.kind == opRewind || o.kind == opFork || o.kind == opSignal || o.kind == opSignalMany
		if ok && makesDue && g.last == opStopNode && g.exclude(defectClaimLostAfterStop) {
			continue
		}
		if ok && g.reopensChild(m, o) && g.exclude(defectReopenedChildNotPending) {
			continue
		}
		if ok {
			g.last = o.kind
			return o
		}
	}
}

func (g *generator) exclude(defect string) bool {
	if g.defects[defect] {
		g.excluded[defect]++
		return true
	}
	return false
}

func (g *generator) anyTask(m *model, f func(*mtask) bool) *mtask {
	var ts []*mtask
	for _, id := range m.sortedIDs() {
		if t := m.tasks[id]; f(t) {
			ts = append(ts, t)
		}
	}
	if len(ts) == 0 {
		return nil
	}
	return ts[g.pick(len(ts))]
}

func (g *generator) someID(m *model) api.TaskID {
	if t := g.anyTask(m, func(*mtask) bool { return true }); t != nil && g.pick(4) > 0 {
		return t.id
	}
	ids := pool[specs[g.pick(len(specs))].id]
	return ids[g.pick(len(ids))]
}

func (g *generator) try(m *model) (op, bool) {
	w := g.pick(104)
	switch {
	case w < 28:
		s := specs[g.pick(len(specs))]
		ids := pool[s.id]
		id := ids[g.pick(len(ids))]
		if m.tasks[id] == nil && g.anyTask(m, func(c *mtask) bool { return c.parent == id }) != nil &&
			g.exclude(defectOrphanChildCountsOffNewParent) {
			return op{}, false
		}
		if t := m.tasks[id]; t != nil && !s.share {
			if t.waiting && t.phase != phaseRunning {
				// What a resubmit of a parent waiting for its children
				// does is not specified: leave it out.
				return op{}, false
			}
			if t.phase == phaseWaiting && t.errors > 0 && g.exclude(defectResubmitRetryWait) {
				return op{}, false
			}
		}
		if g.pick(4) == 0 {
			// A debounced submit, a fourth of them.
			return op{kind: opDebounce, behavior: s.id, id: id, group: poolGroup(id)}, true
		}
		o := op{kind: opSubmit, behavior: s.id, id: id, group: poolGroup(id), delay: g.pick(5) == 0}
		// Half the submits go through an in-process node, whose own
		// submits of due tasks start them on it at once when they may.
		if in := inProcess(m); len(in) > 0 && g.pick(2) == 0 {
			o.node = in[g.pick(len(in))]
		}
		return o, true
	case w < 36:
		id := g.someID(m)
		if t := m.tasks[id]; t != nil && t.waiting && t.phase == phaseWaiting && g.exclude(defectHoldWaitingParent) {
			return op{}, false
		}
		return op{kind: opHold, id: id}, true
	case w < 44:
		id := g.someID(m)
		if t := g.anyTask(m, func(t *mtask) bool { return t.phase == phaseHeld }); t != nil && g.pick(5) > 0 {
			id = t.id
		}
		if t := m.tasks[id]; t != nil && t.phase == phaseHeld && (t.held == dueFuture || slices.Contains(t.heldAlt, dueFuture)) &&
			g.exclude(defectReleaseDropsDue) {
			return op{}, false
		}
		return op{kind: opRelease, id: id}, true
	case w < 47:
		return op{kind: opHoldGroup, group: groupKeys[g.pick(len(groupKeys))]}, true
	case w < 50:
		return op{kind: opReleaseGroup, group: groupKeys[g.pick(len(groupKeys))]}, true
	case w < 52:
		return op{kind: opPause, behavior: specs[g.pick(len(specs))].id}, true
	case w < 55:
		return op{kind: opResume, behavior: specs[g.pick(len(specs))].id}, true
	case w < 59:
		return op{kind: opRemove, id: g.someID(m)}, true
	case w < 63:
		id := g.someID(m)
		if t := g.anyTask(m, func(t *mtask) bool { return t.phase == phaseFailure }); t != nil && g.pick(4) > 0 {
			id = t.id
		}
		if t := m.tasks[id]; t != nil && t.phase == phaseFailure && m.tasks[t.parent] != nil && g.exclude(defectRetriedChildNotPending) {
			return op{}, false
		}
		return op{kind: opRetry, id: id}, true
	case w < 66:
		id := g.someID(m)
		if t := g.anyTask(m, func(t *mtask) bool { return t.phase == phaseSuccess || t.phase == phaseFailure }); t != nil && g.pick(4) > 0 {
			id = t.id
		}
		if t := m.tasks[id]; t != nil && m.tasks[t.parent] != nil && g.exclude(defectRetriedChildNotPending) {
			return op{}, false
		}
		return op{kind: opRewind, id: id, step: g.step(m, id)}, true
	case w < 68:
		id := g.someID(m)
		if t := g.anyTask(m, func(t *mtask) bool { return t.phase != phaseRunning && len(t.steps) > 0 }); t != nil && g.pick(4) > 0 {
			id = t.id
		}
		newID := forkIDs[g.pick(len(forkIDs))]
		if t := g.anyTask(m, func(*mtask) bool { return true }); t != nil && g.pick(5) == 0 {
			newID = t.id // taken: refused
		}
		return op{kind: opFork, id: id, step: g.step(m, id), newID: newID}, true
	case w < 72:
		r := g.sigReq(m, g.signalTarget(m, true))
		return op{kind: opSignal, id: r.id, payload: r.payload, key: r.key}, true
	case w < 76:
		return g.signalMany(m), true
	case w < 98:
		t := g.anyTask(m, func(t *mtask) bool { return t.phase == phaseRunning })
		if t == nil {
			return op{}, false
		}
		o := op{kind: opFinish, id: t.id}
		if len(t.mailbox) > 0 && g.pick(3) == 0 {
			// A run that receives what was sent to its task.
			o.run = []runKind{runSleep, runReceiveFail}[g.pick(2)]
			return o, true
		}
		switch r := g.pick(20); {
		case r < 9:
			o.run = runSuccess
		case r < 13:
			o.run = runFailRetryable
		case r < 15:
			o.run = runFailPermanent
		case r < 17:
			o.run = runSleep
		case r < 18:
			o.run = runReceiveFail
		default:
			if t.parent != "" {
				o.run = runSuccess
			} else {
				o.run, o.children = runSpawn, g.pick(3)
			}
		}
		return o, true
	default:
		var procs []string
		for _, n := range m.nodes {
			if strings.HasPrefix(n, "proc") {
				procs = append(procs, n)
			}
		}
		switch r := g.pick(4); {
		case r == 0 && len(m.nodes) < g.maxNodes:
			return op{kind: opStartNode}, true
		case r == 1 && len(m.nodes) < g.maxNodes && len(procs) == 0 && g.children:
			return op{kind: opStartChild}, true
		case r == 2 && len(procs) > 0:
			n := procs[g.pick(len(procs))]
			if g.resubmitOn(m, n) && g.exclude(defectLostRunKeepsResubmit) {
				return op{}, false
			}
			return op{kind: opKillNode, node: n}, true
		}
		inproc := inProcess(m)
		if len(inproc) == 0 {
			return op{kind: opStartNode}, true
		}
		n := inproc[g.pick(len(inproc))]
		if g.resubmitOn(m, n) && g.exclude(defectLostRunKeepsResubmit) {
			return op{}, false
		}
		return op{kind: opStopNode, node: n}, true
	}
}

// signalTarget draws the task of a signal: a third of the time one that
// sleeps or runs, whose runs receive it, and, with finished, a third one
// that finished for good, which the signal reopens or conflicts with.
func (g *generator) signalTarget(m *model, finished bool) api.TaskID {
	var t *mtask
	switch r := g.pick(6); {
	case r < 2:
		t = g.anyTask(m, func(t *mtask) bool { return t.sleeping || t.phase == phaseRunning })
	case r < 4 && finished:
		t = g.anyTask(m, func(t *mtask) bool { return t.phase == phaseSuccess || t.phase == phaseFailure })
	}
	if t != nil {
		return t.id
	}
	return g.someID(m)
}

// sigReq draws a message for task id: a new payload, and half the time
// an idempotency key: half of those one the task has seen, when it has.
func (g *generator) sigReq(m *model, id api.TaskID) sigReq {
	g.signals++
	r := sigReq{id: id, payload: g.signals}
	if g.pick(2) == 0 {
		return r
	}
	if t := m.tasks[id]; t != nil && len(t.keys) > 0 && g.pick(2) == 0 {
		r.key = t.keys[g.pick(len(t.keys))]
	} else {
		r.key = signalKeys[g.pick(len(signalKeys))]
	}
	return r
}

// signalKeys are the idempotency keys signals draw from.
var signalKeys = []string{"k1", "k2", "k3"}

// signalMany draws a signalmany of 2 or 3 messages: now and then one to a
// task that finished, one to a missing id, or a repeat of an earlier
// message's task (and, half the time, its key).
func (g *generator) signalMany(m *model) op {
	o := op{kind: opSignalMany}
	for i := range 2 + g.pick(2) {
		var r sigReq
		switch p := g.pick(12); {
		case p == 0:
			t := g.anyTask(m, func(t *mtask) bool { return t.phase == phaseSuccess || t.phase == phaseFailure })
			if t == nil {
				r = g.sigReq(m, g.signalTarget(m, false))
				break
			}
			r = g.sigReq(m, t.id)
		case p == 1:
			r = g.sigReq(m, g.missingID(m))
		case p < 4 && i > 0:
			prev := o.reqs[g.pick(i)]
			r = g.sigReq(m, prev.id)
			if g.pick(2) == 0 {
				r.key = prev.key
			}
		default:
			r = g.sigReq(m, g.signalTarget(m, false))
		}
		o.reqs = append(o.reqs, r)
	}
	return o
}

// reopensChild reports whether o signals a child that finished for good,
// whose behavior reopens and whose parent is live.
func (g *generator) reopensChild(m *model, o op) bool {
	reqs := o.reqs
	if o.kind == opSignal {
		reqs = []sigReq{{id: o.id}}
	}
	for _, r := range reqs {
		t := m.tasks[r.id]
		if t == nil || t.phase != phaseSuccess && t.phase != phaseFailure || !spec(t.behavior).reopen {
			continue
		}
		if p := m.tasks[t.parent]; p != nil && p.life == t.parentLife {
			return true
		}
	}
	return false
}

// missingID draws a pool id that holds no task, or one no task ever has.
func (g *generator) missingID(m *model) api.TaskID {
	var ids []api.TaskID
	for _, s := range specs {
		for _, id := range pool[s.id] {
			if m.tasks[id] == nil {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 {
		return "nx-1"
	}
	return ids[g.pick(len(ids))]
}

// step draws a step of task id for a rewind or a fork: mostly one it has,
// now and then the one after its last or 0.
func (g *generator) step(m *model, id api.TaskID) int {
	n := 0
	if t := m.tasks[id]; t != nil {
		n = len(t.steps)
	}
	if n == 0 || g.pick(6) == 0 {
		return []int{0, n + 1}[g.pick(2)]
	}
	return 1 + g.pick(n)
}

// inProcess returns the live nodes of m that run in the test's process,
// not in a child process.
func inProcess(m *model) []string {
	var in []string
	for _, n := range m.nodes {
		if !strings.HasPrefix(n, "proc") {
			in = append(in, n)
		}
	}
	return in
}

// resubmitOn reports whether a task running on node was resubmitted.
func (g *generator) resubmitOn(m *model, node string) bool {
	for _, t := range m.tasks {
		if t.node == node && t.resubmit {
			return true
		}
	}
	return false
}
