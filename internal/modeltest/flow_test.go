package modeltest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
)

// The flow-control model: random sequences of submits (with rate uses and
// group keys), rate limits set, changed and removed, per-key overrides
// and cluster caps set and removed, on nodes that start, stop and (in
// child processes) die by SIGKILL, over a behavior with fair share and
// one without. The model is the log of what was in force when; its
// invariants are checked on the log of run starts (flow_run):
//
//   - never more runs of a key, or of a behavior, at once than the cap in
//     force at the start (the policy's, or the override set at runtime);
//   - never more starts of a limit's key, over any window, than the rule
//     allows (Limit + Limit*w/Period units), by the database's start times;
//   - every task finishes (no task starves while its key has capacity),
//     and every start counts one attempt: waiting counts none.

// FlowParams are the params of the flow model's behaviors.
type FlowParams struct {
	N     int    `json:"n"`
	Key   string `json:"key,omitempty"`
	Limit string `json:"limit,omitempty"`
	Units int64  `json:"units,omitempty"`
	// SleepMS is how long a run takes; FailFirst fails the first attempt
	// (retryably, without delay).
	SleepMS   int  `json:"sleep_ms,omitempty"`
	FailFirst bool `json:"fail_first,omitempty"`
}

// The flow model's behaviors: all cap the behavior at 3 by policy and use
// rate limits; flowPlain and flowFair also cap a key at 2, and flowFair
// serves its keys in turn. flowLoose, with no cap per key, is claimed at
// once while its limits do not bind (and carefully when they do).
var (
	flowPlain = api.BehaviorID("model.flow")
	flowFair  = api.BehaviorID("model.fair")
	flowLoose = api.BehaviorID("model.loose")
)

// flowBehaviors are the flow model's behaviors.
var flowBehaviors = []api.BehaviorID{flowPlain, flowFair, flowLoose}

const (
	flowKeyCap     = 2
	flowClusterCap = 3
	noCap          = 1 << 30
)

// policyCap returns the cap of a flow model behavior's key ("": the
// behavior's cap across the cluster) by its policy.
func policyCap(b api.BehaviorID, key string) int {
	switch {
	case key == "":
		return flowClusterCap
	case b == flowLoose:
		return noCap
	}
	return flowKeyCap
}

// flowBehavior is a flow model behavior on one node.
type flowBehavior struct {
	id   api.BehaviorID
	node string
	pool *pgxpool.Pool
}

func (b *flowBehavior) Kind() api.Kind[FlowParams, struct{}] {
	return api.Kind[FlowParams, struct{}]{ID: b.id}
}
func (b *flowBehavior) TaskID(ids spi.IDs, p FlowParams) api.TaskID {
	return ids.Deterministic(fmt.Sprint(p.N))
}
func (b *flowBehavior) GroupKey(p FlowParams) string { return p.Key }
func (b *flowBehavior) RateUses(p FlowParams) []spi.RateUse {
	if p.Limit == "" {
		return nil
	}
	return []spi.RateUse{{Limit: p.Limit, Key: p.Key, Units: p.Units}}
}
func (b *flowBehavior) Policy() spi.Policy {
	keyCap := flowKeyCap
	if b.id == flowLoose {
		keyCap = 0
	}
	return spi.Policy{Lease: lease, MaxAttempts: 5, BackoffMin: shortBackoff, BackoffMax: shortBackoff,
		GroupConcurrency: keyCap, ClusterConcurrency: flowClusterCap, FairShare: b.id == flowFair,
		RateLimits: []api.RateLimit{{Name: "declared", Limit: 3, Period: 300 * time.Millisecond}}}
}

func (b *flowBehavior) Run(ctx context.Context, rc spi.RunContext, p FlowParams) (struct{}, error) {
	// Every run that starts is logged, even one whose lease is already
	// lost (a busy machine can delay a renewal past the lease): its
	// attempt counted, and the check counts attempts by the starts logged.
	var id int64
	if err := b.pool.QueryRow(context.WithoutCancel(ctx), `INSERT INTO flow_run (task_id, attempt, node, behavior, key, executed_at)
		SELECT $1, $2, $3, $4, $5, executed_at FROM stint_task WHERE id = $1 RETURNING id`,
		string(rc.TaskID()), rc.Attempt(), b.node, string(b.id), p.Key).Scan(&id); err != nil {
		return struct{}{}, err
	}
	defer b.pool.Exec(context.Background(), `UPDATE flow_run SET ended = clock_timestamp() WHERE id = $1 AND ended IS NULL`, id)
	if err := spi.Sleep(ctx, time.Duration(p.SleepMS)*time.Millisecond); err != nil {
		return struct{}{}, err
	}
	if p.FailFirst && rc.Attempt() == 1 {
		return struct{}{}, &api.TaskError{Retryable: true, Code: "planned", Message: "the first attempt fails"}
	}
	return struct{}{}, nil
}

// registerFlow adds the flow model's behaviors to reg.
func registerFlow(reg *spi.Registry, pool *pgxpool.Pool, node string) {
	for _, id := range flowBehaviors {
		spi.MustRegister[FlowParams, struct{}](reg, &flowBehavior{id: id, node: node, pool: pool})
	}
}

// flowRateLimits are the limits a sequence sets (and "declared", stored by
// the first submit that names it).
var flowRateLimits = []string{"api", "bytes", "declared"}

// flowChange is a change of what is in force, between begin and end (the
// call's start and return).
type flowChange struct {
	begin, end time.Time
	// limit names a rate limit set (rate set) or removed (rate nil); else
	// it is a cap of behavior and key set (max > 0) or removed (0).
	limit    string
	rate     *api.RateLimit
	behavior api.BehaviorID
	key      string
	max      int
}

// flowStats count what the flow sequences did and checked.
type flowStats struct {
	ops                                map[string]int
	tasks, starts, capChecks, windows  int
	rateKeys, sequences, killed, kills int
}

// TestFlowModel runs random flow-control sequences and checks their
// invariants on the run log.
func TestFlowModel(t *testing.T) {
	seqs := *flagSeqs
	if testing.Short() {
		seqs = 1
	}
	st := &flowStats{ops: map[string]int{}}
	base := uint64(time.Now().UnixNano())
	if *flagSeed != 0 {
		base, seqs = *flagSeed, 1
	}
	for i := range seqs {
		seed := base + uint64(i)
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runFlowSequence(t, seed, st) })
	}
	t.Logf("flow model: %d sequences, %d tasks, %d starts, %d cap checks, %d rate windows over %d keys, %d nodes killed; ops %v",
		st.sequences, st.tasks, st.starts, st.capChecks, st.windows, st.rateKeys, st.kills, st.ops)
}

func runFlowSequence(t *testing.T, seed uint64, st *flowStats) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h, err := newHarness(ctx, pgtest.New(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	if _, err := h.pool.Exec(ctx, `CREATE TABLE flow_run (id bigserial PRIMARY KEY, task_id text NOT NULL, attempt int NOT NULL,
		node text NOT NULL, behavior text NOT NULL, key text NOT NULL, executed_at timestamptz NOT NULL,
		started timestamptz NOT NULL DEFAULT clock_timestamp(), ended timestamptz)`); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	for range 2 {
		if _, err := h.startNode(); err != nil {
			t.Fatal(err)
		}
	}
	var changes []flowChange
	first := api.RateLimit{Name: "api", Limit: 4, Period: 200 * time.Millisecond}
	changes = append(changes, flowChange{begin: time.Now(), limit: first.Name, rate: &first})
	if err := h.client.SetRateLimit(ctx, first); err != nil {
		t.Fatal(err)
	}
	changes[0].end = time.Now()
	var ids []api.TaskID
	// lost holds when a node was killed or stopped without waiting for its
	// runs: a task it had claimed but not started yet has counted an
	// attempt no start logs.
	var lost []time.Time
	n := 0
	keys := []string{"", "a", "b", "c"}
	steps := *flagSteps
	for step := 0; step < steps; step++ {
		var op string
		switch r := rng.IntN(100); {
		case r < 45:
			op = "submit"
			var reqs []api.SubmitRequest
			for range 1 + rng.IntN(8) {
				n++
				p := FlowParams{N: n, Key: keys[rng.IntN(len(keys))], SleepMS: rng.IntN(60), FailFirst: rng.IntN(8) == 0}
				if rng.IntN(3) > 0 {
					p.Limit = flowRateLimits[rng.IntN(len(flowRateLimits))]
					p.Units = 1 + rng.Int64N(2)
				}
				b := flowBehaviors[rng.IntN(len(flowBehaviors))]
				raw, _ := json.Marshal(p)
				reqs = append(reqs, api.SubmitRequest{Behavior: b, Params: raw})
			}
			subs, err := h.client.SubmitMany(ctx, reqs)
			if err != nil {
				// A limit not stored yet nor declared is refused as a
				// whole: nothing stored.
				if !strings.Contains(err.Error(), "does not exist") {
					t.Fatalf("step %d: submit: %v", step, err)
				}
				op = "submit refused"
				n -= len(reqs)
				break
			}
			for _, s := range subs {
				ids = append(ids, s.ID)
			}
		case r < 60:
			name := flowRateLimits[rng.IntN(2)]
			l := api.RateLimit{Name: name, Limit: 2 + rng.Int64N(4), Period: time.Duration(100+rng.IntN(400)) * time.Millisecond}
			c := flowChange{begin: time.Now(), limit: name, rate: &l}
			op = "set rate limit"
			if err := h.client.SetRateLimit(ctx, l); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			c.end = time.Now()
			changes = append(changes, c)
		case r < 65:
			name := flowRateLimits[rng.IntN(len(flowRateLimits))]
			c := flowChange{begin: time.Now(), limit: name}
			op = "remove rate limit"
			if err := h.client.RemoveRateLimit(ctx, name); err != nil && !errorsIsNotFound(err) {
				t.Fatalf("step %d: %v", step, err)
			}
			c.end = time.Now()
			changes = append(changes, c)
		case r < 80:
			b := flowBehaviors[rng.IntN(len(flowBehaviors))]
			key := keys[1+rng.IntN(len(keys)-1)]
			if rng.IntN(3) == 0 {
				key = "" // the cluster cap
			}
			c := flowChange{begin: time.Now(), behavior: b, key: key}
			if rng.IntN(3) > 0 {
				c.max = 1 + rng.IntN(4)
				op = "set cap"
				weight := 0
				if key != "" {
					weight = rng.IntN(3)
				}
				if err := h.client.SetConcurrencyLimit(ctx, api.ConcurrencyLimit{Behavior: b, Key: key, Max: c.max, Weight: weight}); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
			} else {
				op = "remove cap"
				if err := h.client.RemoveConcurrencyLimit(ctx, b, key); err != nil && !errorsIsNotFound(err) {
					t.Fatalf("step %d: %v", step, err)
				}
			}
			c.end = time.Now()
			changes = append(changes, c)
		case r < 85 && *flagProcs:
			op = "start child node"
			h.startChild(t)
		case r < 90:
			op = "kill node"
			for name := range h.procs {
				if err := h.killFlowChild(name); err != nil {
					t.Fatal(err)
				}
				st.kills++
				lost = append(lost, time.Now())
				break
			}
		case r < 95:
			op = "stop node"
			if len(h.nodes) > 1 {
				for name := range h.nodes {
					if err := h.abandonNode(name); err != nil {
						t.Fatal(err)
					}
					lost = append(lost, time.Now())
					break
				}
			}
		default:
			op = "start node"
			if _, err := h.startNode(); err != nil {
				t.Fatal(err)
			}
		}
		st.ops[op]++
		time.Sleep(time.Duration(rng.IntN(80)) * time.Millisecond)
	}
	// Everything finishes: caps are at least 1 and limits admit every
	// task's units in time.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		left := 0
		for _, id := range ids {
			task, err := h.client.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if !task.Finished() {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("seed %d: %d tasks did not finish", seed, left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for name := range h.procs {
		if err := h.killFlowChild(name); err != nil {
			t.Fatal(err)
		}
	}
	checkFlow(t, ctx, h, seed, ids, changes, lost, st)
	st.sequences++
	st.tasks += len(ids)
}

// killFlowChild kills a child node and ends its open runs in the log.
func (h *harness) killFlowChild(name string) error {
	if err := h.killChild(name); err != nil {
		return err
	}
	_, err := h.pool.Exec(h.ctx, `UPDATE flow_run SET ended = clock_timestamp() WHERE node = $1 AND ended IS NULL`, name)
	return err
}

func errorsIsNotFound(err error) bool { return errors.Is(err, api.ErrNotFound) }

// flowStart is a run start of the log.
type flowStart struct {
	task           string
	attempt        int
	behavior       api.BehaviorID
	key            string
	executed       time.Time
	started, ended time.Time
	limit          string
	units          int64
}

// claimSlack bounds how long before a run's start its claim may have read
// the caps and limits in force: a claim's statements and the run's start
// on a busy machine.
const claimSlack = 2 * time.Second

// rateSlack bounds how long before its start time (the claim
// transaction's now) a claim reads a rate limit's values: its first
// statements, and the locks it waits for.
const rateSlack = 500 * time.Millisecond

func checkFlow(t *testing.T, ctx context.Context, h *harness, seed uint64, ids []api.TaskID, changes []flowChange, lost []time.Time, st *flowStats) {
	// A run logged by a node killed as it logged it has no end: it counts
	// as ended at once (fewer runs at a time, never more).
	rows, err := h.pool.Query(ctx, `SELECT r.task_id, r.attempt, r.behavior, r.key, r.executed_at, r.started, coalesce(r.ended, r.started),
		coalesce(t.params->>'limit', ''), coalesce((t.params->>'units')::bigint, 1)
		FROM flow_run r JOIN stint_task t ON t.id = r.task_id ORDER BY r.started`)
	if err != nil {
		t.Fatal(err)
	}
	var starts []flowStart
	for rows.Next() {
		var s flowStart
		var b string
		if err := rows.Scan(&s.task, &s.attempt, &b, &s.key, &s.executed, &s.started, &s.ended, &s.limit, &s.units); err != nil {
			t.Fatal(err)
		}
		s.behavior = api.BehaviorID(b)
		starts = append(starts, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	st.starts += len(starts)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d: "+format, append([]any{seed}, args...)...)
	}

	// Only starts count attempts (a stopped node gives its runs back
	// without counting theirs): waiting counts none. A node killed or
	// abandoned may have claimed a task it never started: each such loss
	// before a start allows that start one attempt more.
	attempts := map[string]int{}
	for _, s := range starts {
		attempts[s.task]++
		gap := 0
		for _, at := range lost {
			if at.Before(s.started) {
				gap++
			}
		}
		if s.attempt < 1 || s.attempt > attempts[s.task]+gap {
			fail("task %s started attempt %d as its start number %d (%d nodes lost before)", s.task, s.attempt, attempts[s.task], gap)
		}
	}
	for _, id := range ids {
		task, err := h.client.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if task.Status != api.StatusSuccess || task.Attempt > attempts[string(id)]+len(lost) {
			fail("task %s: %s after %d attempts, %d starts logged", id, task.Status, task.Attempt, attempts[string(id)])
		}
	}

	// Caps: at each start, the runs of its key (and of its behavior) that
	// overlap it are no more than the largest cap in force from
	// claimSlack before it.
	capAt := func(b api.BehaviorID, key string, at time.Time) int {
		cap := policyCap(b, key)
		best := -1
		for _, c := range changes {
			if c.limit != "" || c.rate != nil || c.behavior != b || c.key != key || c.begin.After(at) {
				continue
			}
			v := c.max
			if v == 0 {
				v = policyCap(b, key)
			}
			if c.end.Before(at.Add(-claimSlack)) {
				cap = v // in force before the window
				continue
			}
			best = max(best, v) // changed within the window: either may apply
		}
		return max(cap, best)
	}
	for _, s := range starts {
		var key, all int
		for _, o := range starts {
			if o.behavior != s.behavior || !o.started.Before(s.started.Add(time.Nanosecond)) || !o.ended.After(s.started) {
				continue
			}
			all++
			if o.key == s.key {
				key++
			}
		}
		if s.key != "" {
			if c := capAt(s.behavior, s.key, s.started); key > c {
				fail("%d runs of %s key %q at %s, over its cap %d", key, s.behavior, s.key, s.started, c)
			}
		}
		if c := capAt(s.behavior, "", s.started); all > c {
			fail("%d runs of %s at %s, over its cap %d", all, s.behavior, s.started, c)
		}
		st.capChecks++
	}

	// Rate limits: between two changes of a limit, its keys' starts (by
	// the database's clock) keep to the rule of the values set.
	type ref struct{ limit, key string }
	byKey := map[ref][]flowStart{}
	for _, s := range starts {
		if s.limit != "" {
			byKey[ref{s.limit, s.key}] = append(byKey[ref{s.limit, s.key}], s)
		}
	}
	declared := api.RateLimit{Name: "declared", Limit: 3, Period: 300 * time.Millisecond}
	for r, ss := range byKey {
		st.rateKeys++
		sort.Slice(ss, func(i, j int) bool { return ss[i].executed.Before(ss[j].executed) })
		// The segments of constant values: from the end of a change to
		// the start of the next (minus the slack), with its values.
		type segment struct {
			from, to time.Time
			l        *api.RateLimit
		}
		var segs []segment
		cur := segment{from: time.Time{}}
		if r.limit == "declared" {
			cur.l = &declared
		}
		for _, c := range changes {
			if c.limit != r.limit {
				continue
			}
			cur.to = c.begin.Add(-rateSlack)
			segs = append(segs, cur)
			cur = segment{from: c.end, l: c.rate}
		}
		cur.to = time.Now().Add(time.Hour)
		segs = append(segs, cur)
		for _, sg := range segs {
			if sg.l == nil {
				continue
			}
			var in []flowStart
			for _, s := range ss {
				if s.executed.After(sg.from) && s.executed.Before(sg.to) {
					in = append(in, s)
				}
			}
			for i := range in {
				var units int64
				for j := i; j < len(in); j++ {
					units += in[j].units
					w := in[j].executed.Sub(in[i].executed)
					allowed := float64(sg.l.Limit) + float64(sg.l.Limit)*float64(w)/float64(sg.l.Period)
					if float64(units) > allowed+1e-9 {
						fail("limit %s key %q: %d units started within %s, over the rule's %.2f (%d per %s)",
							r.limit, r.key, units, w, allowed, sg.l.Limit, sg.l.Period)
					}
					st.windows++
				}
			}
		}
	}
}
