package replication

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// Penalty returns the backoff penalty after crash number n (1 for the
// first): min * 2^min(n, log2(max/min)), at most max, jittered to 75-100%,
// the CouchDB replicator's penalty for a crashing job.
func Penalty(lo, hi time.Duration, n int) time.Duration {
	return time.Duration(float64(FullPenalty(lo, hi, n)) * (0.75 + 0.25*rand.Float64()))
}

// FullPenalty is Penalty without the jitter: the upper bound of the delay.
func FullPenalty(lo, hi time.Duration, n int) time.Duration {
	if lo <= 0 || hi < lo {
		return lo
	}
	capExp := math.Log2(float64(hi) / float64(lo))
	if float64(n) >= capExp {
		return hi
	}
	return time.Duration(float64(lo) * math.Pow(2, float64(max(n, 0))))
}

// State is a replication's state in the CouchDB replicator's terms.
type State string

// The replication states.
const (
	// StatePending is a replication waiting to run: new, stopped for
	// rotation, or held.
	StatePending State = "pending"
	// StateRunning is a replication held by a node.
	StateRunning State = "running"
	// StateCrashing is a replication whose last run failed and that runs
	// again after its backoff penalty.
	StateCrashing State = "crashing"
	// StateCompleted is a one-shot replication that caught up.
	StateCompleted State = "completed"
	// StateFailed is a replication that failed for good: invalid, or in
	// collision with a persistent one.
	StateFailed State = "failed"
)

// StateOf maps a replication's task to its state.
func StateOf(t api.Task) State {
	switch {
	case t.Status == api.StatusRunning:
		return StateRunning
	case t.Resubmit:
		return StatePending
	case t.Status == api.StatusFailure && t.ScheduleNotBefore != nil:
		return StateCrashing
	case t.Status == api.StatusFailure:
		return StateFailed
	case t.Status == api.StatusSuccess && t.ScheduleNotBefore == nil:
		return StateCompleted
	}
	return StatePending
}

// Info is what monitoring shows of a replication.
type Info struct {
	// TaskID is the replication's task; empty for a persistent definition
	// whose task was deleted after it ended.
	TaskID     api.TaskID `json:"task_id,omitempty"`
	Definition string     `json:"definition,omitempty"`
	Continuous bool       `json:"continuous"`
	State      State      `json:"state"`
	// Node is the node running it, or that last ran it.
	Node string `json:"node,omitempty"`
	// Source and Target are the endpoints, passwords blanked.
	Source Endpoint `json:"source"`
	Target Endpoint `json:"target"`
	Owner  string   `json:"owner,omitempty"`
	// Seq is the last sequence (change value) replicated.
	Seq int64 `json:"seq"`
	// Lag is how many change values the source was ahead at the last
	// checkpoint, when LagKnown; LagAt is when the source was read.
	Lag int64 `json:"lag"`
	// LagKnown is false when no checkpoint says how far behind the
	// replication is: none was taken yet, or the replication runs and has
	// not checkpointed since it started (the stored lag is an earlier
	// run's). Lag is then 0 and means nothing; show LagText.
	LagKnown bool       `json:"lag_known"`
	LagAt    *time.Time `json:"lag_at,omitempty"`
	// Errors counts consecutive crashes (healing resets it).
	Errors    int    `json:"errors"`
	LastError string `json:"last_error,omitempty"`
	// NextRun is when a pending or crashing replication runs next.
	NextRun *time.Time `json:"next_run,omitempty"`
	// CheckpointedAt is the time of the last checkpoint.
	CheckpointedAt *time.Time `json:"checkpointed_at,omitempty"`
	Progress       *Progress  `json:"progress,omitempty"`
	Result         *Result    `json:"result,omitempty"`
	UpdatedAt      time.Time  `json:"updated_at"`
}

// InfoOf returns the monitoring view of a replication task.
func InfoOf(t api.Task) Info {
	info := Info{TaskID: t.ID, Continuous: t.Behavior == ContinuousBehavior, State: StateOf(t), Node: t.Node,
		UpdatedAt: t.UpdatedAt, Errors: t.Errors}
	var p Params
	if err := p.UnmarshalJSON(t.Params); err == nil || p.Source.DSN != "" {
		info.Definition, info.Owner = p.Definition, p.Owner
		info.Source = Endpoint{DSN: spi.RedactDSN(p.Source.DSN), Table: p.Source.Table}
		info.Target = Endpoint{DSN: spi.RedactDSN(p.Target.DSN), Table: p.Target.Table}
	}
	if prog, err := decodeProgress(t.Progress); err == nil && len(t.Progress) > 0 {
		info.Progress = &prog
		info.Seq = prog.Seq
		if lagKnown(prog, info.State) {
			at := prog.SourceSeqAt
			info.Lag, info.LagKnown, info.LagAt = max(prog.SourceSeq-prog.Seq, 0), true, &at
		}
		info.Errors, info.LastError = prog.Errors, prog.LastError
		if !prog.CheckpointedAt.IsZero() {
			at := prog.CheckpointedAt
			info.CheckpointedAt = &at
		}
	}
	if t.Status == api.StatusSuccess && len(t.Result) > 0 {
		var r Result
		if err := json.Unmarshal(t.Result, &r); err == nil {
			info.Result = &r
			info.Seq = max(info.Seq, r.Seq)
		}
	}
	if t.Error != nil && info.State != StateCompleted {
		info.LastError = t.Error.Error()
	}
	if info.State == StatePending || info.State == StateCrashing {
		info.NextRun = t.ScheduleNotBefore
	}
	return info
}

// lagKnown reports whether progress tells a replication in state how far
// behind it is: the source's head was read, and, while it runs, by the
// current run (whose progress has HealthySince; a stopped or crashed run
// clears it).
func lagKnown(prog Progress, state State) bool {
	if prog.SourceSeqAt.IsZero() {
		return false
	}
	return state != StateRunning || prog.HealthySince != nil
}

// LagText returns the lag for people: the number of changes the
// replication is behind, with how long ago that was measured, or
// "unknown".
func (i Info) LagText(now time.Time) string {
	if !i.LagKnown {
		return "unknown"
	}
	s := strconv.FormatInt(i.Lag, 10)
	if i.LagAt != nil {
		s += " (" + now.Sub(*i.LagAt).Round(time.Second).String() + " ago)"
	}
	return s
}

// InfoOfDefinition returns the monitoring view of a persistent
// replication whose task is gone (deleted after it ended, or not
// submitted yet): its state is the definition's terminal state, or
// pending.
func InfoOfDefinition(d StoredDefinition) Info {
	info := Info{TaskID: d.TaskID, Definition: d.Name, Continuous: d.Continuous, State: d.State, Owner: d.Params.Owner,
		Source:    Endpoint{DSN: spi.RedactDSN(d.Params.Source.DSN), Table: d.Params.Source.Table},
		Target:    Endpoint{DSN: spi.RedactDSN(d.Params.Target.DSN), Table: d.Params.Target.Table},
		UpdatedAt: d.UpdatedAt}
	if d.StateAt != nil {
		info.UpdatedAt = *d.StateAt
	}
	switch d.State {
	case StateCompleted:
		var r Result
		if json.Unmarshal(d.StateDetail, &r) == nil {
			info.Result, info.Seq = &r, r.Seq
		}
	case StateFailed:
		var te api.TaskError
		if json.Unmarshal(d.StateDetail, &te) == nil {
			info.LastError = te.Error()
		}
	default:
		info.State = StatePending
	}
	return info
}

// List returns the monitoring view of every replication: the tasks of
// both behaviors, and the persistent definitions whose task is gone. db
// is the stint database; nil leaves the definitions out. The list is in
// task id order, definitions without a task last.
func List(ctx context.Context, tasks api.Tasks, db *pgxpool.Pool) ([]Info, error) {
	var out []Info
	for _, b := range []api.BehaviorID{OneShotBehavior, ContinuousBehavior} {
		f := api.Filter{Behavior: b, Limit: 1000}
		for {
			page, err := tasks.List(ctx, f)
			if err != nil {
				return nil, fmt.Errorf("list replications: %w", err)
			}
			for _, t := range page.Tasks {
				out = append(out, InfoOf(t))
			}
			if page.Next == "" {
				break
			}
			f.After = page.Next
		}
	}
	slices.SortFunc(out, func(a, b Info) int { return strings.Compare(string(a.TaskID), string(b.TaskID)) })
	if db == nil {
		return out, nil
	}
	defs, err := Definitions(ctx, db)
	if err != nil {
		return nil, err
	}
	index := map[api.TaskID]int{}
	for i, info := range out {
		index[info.TaskID] = i
	}
	for _, d := range defs {
		if i, ok := index[d.TaskID]; ok {
			out[i].Definition = d.Name
			continue
		}
		out = append(out, InfoOfDefinition(d))
	}
	return out, nil
}

// Lookup returns the monitoring view of one replication, by task id or by
// definition name, with its definition when it has one. It returns
// api.ErrNotFound when neither matches.
func Lookup(ctx context.Context, tasks api.Tasks, db *pgxpool.Pool, idOrName string) (Info, *StoredDefinition, error) {
	var def *StoredDefinition
	if db != nil {
		if d, err := loadDefinition(ctx, db, idOrName); err == nil {
			def = &d
		} else if !errors.Is(err, errNoDefinition) {
			return Info{}, nil, fmt.Errorf("look up replication %q: %w", idOrName, err)
		}
	}
	id := api.TaskID(idOrName)
	if def != nil {
		id = def.TaskID
	}
	t, err := tasks.Get(ctx, id)
	switch {
	case err == nil:
		info := InfoOf(t)
		if def == nil && db != nil && info.Definition != "" {
			if d, derr := loadDefinition(ctx, db, info.Definition); derr == nil && d.TaskID == t.ID {
				def = &d
			}
		}
		if def != nil {
			info.Definition = def.Name
		}
		return info, def, nil
	case errors.Is(err, api.ErrNotFound) && def != nil:
		return InfoOfDefinition(*def), def, nil
	case errors.Is(err, api.ErrNotFound):
		return Info{}, nil, fmt.Errorf("replication %q: %w", idOrName, api.ErrNotFound)
	default:
		return Info{}, nil, fmt.Errorf("look up replication %q: %w", idOrName, err)
	}
}
