package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stinthq/stint/api"
)

// HoldCollection holds a collection (profile): its batches and jobs are
// not picked up, on any node, until ReleaseCollection, and its Pending
// ones move to Held, as Merritt's queue moves a job of a held collection
// when it picks it up (a job or batch picked up just before the hold does
// so itself when its run starts). Running jobs run on; jobs waiting in a
// later stage keep their state and wait.
func (a *Admin) HoldCollection(ctx context.Context, profile string) error {
	if !profilePattern.MatchString(profile) {
		return api.Invalid("profile", "%q: want 1 to 128 characters from A-Z a-z 0-9 . _ -", truncate(profile))
	}
	if err := a.client.HoldGroup(ctx, profile); err != nil {
		return err
	}
	return a.moveWaiting(ctx, profile, JobPending, JobHeld, BatchPending, BatchHeld)
}

// ReleaseCollection lifts a collection hold and moves the collection's
// Held batches and jobs back to Pending, but for those held one by one
// (Hold), which Release releases.
func (a *Admin) ReleaseCollection(ctx context.Context, profile string) error {
	if !profilePattern.MatchString(profile) {
		return api.Invalid("profile", "%q: want 1 to 128 characters from A-Z a-z 0-9 . _ -", truncate(profile))
	}
	if err := a.client.ReleaseGroup(ctx, profile); err != nil {
		return err
	}
	return a.moveWaiting(ctx, profile, JobHeld, JobPending, BatchHeld, BatchPending)
}

// moveWaiting moves the waiting (scheduled, not running) jobs of profile
// in state jobFrom to jobTo, and its batches in batchFrom to batchTo. A
// task that changes meanwhile (picked up, say) is left to its run, which
// applies the same rule.
func (a *Admin) moveWaiting(ctx context.Context, profile string, jobFrom, jobTo JobState, batchFrom, batchTo BatchState) error {
	now := time.Now().UTC()
	for _, b := range []api.BehaviorID{JobBehavior, BatchBehavior} {
		f := api.Filter{Behavior: b, GroupKey: profile, Status: api.StatusScheduled, Limit: 1000}
		for {
			page, err := a.client.List(ctx, f)
			if err != nil {
				return fmt.Errorf("list the waiting %s tasks of collection %s: %w", b, profile, err)
			}
			for _, t := range page.Tasks {
				progress, ok := movedProgress(t, jobFrom, jobTo, batchFrom, batchTo, now)
				if !ok {
					continue
				}
				if err := a.writeProgress(ctx, t.ID, t.Progress, progress, api.StatusScheduled); err != nil &&
					!errors.Is(err, api.ErrConflict) && !errors.Is(err, api.ErrNotFound) {
					return err
				}
			}
			if page.Next == "" {
				break
			}
			f.After = page.Next
		}
	}
	return nil
}

// movedProgress returns the progress of the job or batch t moved from
// jobFrom to jobTo (a batch: batchFrom to batchTo), and false when t is
// not in the from state or its progress cannot be read.
func movedProgress(t api.Task, jobFrom, jobTo JobState, batchFrom, batchTo BatchState, now time.Time) (any, bool) {
	if t.Behavior == JobBehavior {
		var p JobProgress
		if len(t.Progress) > 0 && json.Unmarshal(t.Progress, &p) != nil {
			return nil, false
		}
		if p.state() != jobFrom || p.Transition(jobTo, now) != nil {
			return nil, false
		}
		return p, true
	}
	var p BatchProgress
	if len(t.Progress) > 0 && json.Unmarshal(t.Progress, &p) != nil {
		return nil, false
	}
	if p.state() != batchFrom || p.Transition(batchTo, now) != nil {
		return nil, false
	}
	return p, true
}

// HeldCollections lists the held collections (and any other held group
// keys).
func (a *Admin) HeldCollections(ctx context.Context) ([]string, error) {
	return a.client.HeldGroups(ctx)
}

// PauseQueue stops the pickup of batches and jobs on every node until
// ResumeQueue. Running ones run on.
func (a *Admin) PauseQueue(ctx context.Context) error {
	for _, b := range []api.BehaviorID{BatchBehavior, JobBehavior} {
		if err := a.client.Pause(ctx, b); err != nil {
			return fmt.Errorf("pause %s: %w", b, err)
		}
	}
	return nil
}

// ResumeQueue lifts PauseQueue.
func (a *Admin) ResumeQueue(ctx context.Context) error {
	for _, b := range []api.BehaviorID{BatchBehavior, JobBehavior} {
		if err := a.client.Resume(ctx, b); err != nil {
			return fmt.Errorf("resume %s: %w", b, err)
		}
	}
	return nil
}

// Hold holds a Pending job or batch (Pending -> Held): it is not picked up
// until Release.
func (a *Admin) Hold(ctx context.Context, id api.TaskID) error {
	t, err := a.get(ctx, id, JobBehavior, BatchBehavior)
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	if t.Behavior == JobBehavior {
		var p JobProgress
		_ = json.Unmarshal(t.Progress, &p)
		if err := p.Transition(JobHeld, now); err != nil {
			return illegal(err)
		}
		if err := a.client.Hold(ctx, id); err != nil {
			return fmt.Errorf("hold %s: %w", id, err)
		}
		return a.writeProgress(ctx, id, t.Progress, p, api.StatusHeld)
	}
	var p BatchProgress
	_ = json.Unmarshal(t.Progress, &p)
	if err := p.Transition(BatchHeld, now); err != nil {
		return illegal(err)
	}
	if err := a.client.Hold(ctx, id); err != nil {
		return fmt.Errorf("hold %s: %w", id, err)
	}
	return a.writeProgress(ctx, id, t.Progress, p, api.StatusHeld)
}

// Release releases a held job or batch (Held -> Pending). A job held by a
// collection hold is released with ReleaseCollection.
func (a *Admin) Release(ctx context.Context, id api.TaskID) error {
	t, err := a.get(ctx, id, JobBehavior, BatchBehavior)
	if err != nil {
		return err
	}
	if t.Status != api.StatusHeld {
		held, herr := a.heldSet(ctx)
		if herr == nil && held[t.GroupKey] {
			return conflict("%s is held by the hold of collection %s: release the collection", id, t.GroupKey)
		}
		if herr == nil && t.Status == api.StatusScheduled {
			// Held by a collection hold lifted otherwise than by
			// ReleaseCollection (a plain group release): back to Pending.
			if p, ok := movedProgress(t, JobHeld, JobPending, BatchHeld, BatchPending, time.Now().UTC()); ok {
				return a.writeProgress(ctx, id, t.Progress, p, api.StatusScheduled)
			}
		}
		return conflict("%s is not held", id)
	}
	now := time.Now().UTC()
	var progress any
	if t.Behavior == JobBehavior {
		var p JobProgress
		_ = json.Unmarshal(t.Progress, &p)
		if p.state() == JobHeld {
			if err := p.Transition(JobPending, now); err != nil {
				return illegal(err)
			}
			progress = p
		}
	} else {
		var p BatchProgress
		_ = json.Unmarshal(t.Progress, &p)
		if p.state() == BatchHeld {
			if err := p.Transition(BatchPending, now); err != nil {
				return illegal(err)
			}
			progress = p
		}
	}
	if progress != nil {
		if err := a.writeProgress(ctx, id, t.Progress, progress, api.StatusHeld); err != nil {
			return err
		}
	}
	if err := a.client.Release(ctx, id); err != nil {
		return fmt.Errorf("release %s: %w", id, err)
	}
	return nil
}
