package impl

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"
	_ "time/tzdata" // time zones of schedules, also on machines without a zoneinfo database

	"github.com/robfig/cron/v3"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// scheduleCheck is the longest a server waits between two looks for due
// schedule ticks: a schedule added at runtime is seen within it. Between
// looks it sleeps until the next tick of its schedules falls due, by the
// database's clock, so that it looks just after each tick rather than a
// fixed time after its last look (which drifts later by the look's own
// time, until two ticks fall due at one look). Ticks have a resolution of
// one second.
const scheduleCheck = time.Second

// scheduleMargin is how long after a tick a server looks for it, against
// the error of its reading of the database's clock; also its shortest
// wait.
const scheduleMargin = 5 * time.Millisecond

// scheduleDowntime is how overdue a tick must be to count as missed while
// no server fired its schedule: such ticks fire once, as the latest of
// them. Ticks less overdue fell while servers were up, only late to look
// (a slow look, a busy machine, a schedule locked for a while by another
// node's firing), and each of them fires.
const scheduleDowntime = 10 * time.Second

var (
	scheduleName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	cronParser   = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
)

// parseSchedule checks a schedule's name, spec and time zone and returns
// when it fires.
func parseSchedule(sc api.Schedule) (cron.Schedule, error) {
	if !scheduleName.MatchString(sc.Name) {
		return nil, api.Invalid("name", "%q: want 1 to 64 characters from a-z 0-9 . _ -, starting with a letter or digit", sc.Name)
	}
	loc := time.UTC
	if sc.TimeZone != "" {
		var err error
		if loc, err = time.LoadLocation(sc.TimeZone); err != nil {
			return nil, api.Invalid("time_zone", "%q is not an IANA time zone", sc.TimeZone)
		}
	}
	sched, err := cronParser.Parse(sc.Spec)
	if err != nil {
		return nil, api.Invalid("spec", "%q: %v; want five cron fields, @hourly and the like, or @every 1h", sc.Spec, err)
	}
	if s, ok := sched.(*cron.SpecSchedule); ok {
		s.Location = loc
	}
	if every, ok := strings.CutPrefix(sc.Spec, "@every "); ok {
		// The parser rounds an interval to whole seconds, at least one:
		// refuse what it would change rather than run at another rate.
		if d, _ := time.ParseDuration(every); d < time.Second || d%time.Second != 0 {
			return nil, api.Invalid("spec", "%q: the interval must be whole seconds, at least 1s", sc.Spec)
		}
	}
	return sched, nil
}

// checkSchedule checks a schedule and the params of its tasks against the
// behavior, as a submit would.
func (c *Client) checkSchedule(sc api.Schedule) (cron.Schedule, error) {
	sched, err := parseSchedule(sc)
	if err != nil {
		return nil, fmt.Errorf("schedule %s: %w", sc.Name, err)
	}
	if _, _, err := c.prepare(api.SubmitRequest{Behavior: sc.Behavior, Params: sc.Params, ID: tickID(sc.Name, time.Now())}); err != nil {
		return nil, fmt.Errorf("schedule %s: %w", sc.Name, err)
	}
	return sched, nil
}

// tickID is the id of the task a schedule fires at tick.
func tickID(name string, tick time.Time) api.TaskID {
	return api.TaskID(fmt.Sprintf("schedule:%s:%d", name, tick.Unix()))
}

// AddSchedule stores a schedule, or replaces the added schedule of the same
// name (keeping when it last fired). Its behavior must be registered with
// this process, and its params must be valid for it. The servers that run
// the behavior fire it. A name taken by a schedule a behavior declares is
// api.ErrConflict.
func (c *Client) AddSchedule(ctx context.Context, sc api.Schedule) error {
	if _, err := c.checkSchedule(sc); err != nil {
		return err
	}
	return c.st.PutSchedules(ctx, []api.Schedule{sc}, false)
}

// RemoveSchedule deletes a schedule; api.ErrNotFound if there is none. A
// schedule a behavior declares is stored again when a server that runs the
// behavior starts.
func (c *Client) RemoveSchedule(ctx context.Context, name string) error {
	if !scheduleName.MatchString(name) {
		return api.Invalid("name", "%q is not a schedule name", name)
	}
	return c.st.DeleteSchedule(ctx, name)
}

// Schedules lists the schedules with their next tick. The next tick of a
// schedule whose spec this version cannot read is zero.
func (c *Client) Schedules(ctx context.Context) ([]api.ScheduleInfo, error) {
	rows, _, err := c.st.Schedules(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.ScheduleInfo, len(rows))
	for i, r := range rows {
		out[i] = api.ScheduleInfo{Schedule: r.Schedule, Registered: r.Registered, LastTick: r.LastTick, CreatedAt: r.CreatedAt}
		if sched, err := parseSchedule(r.Schedule); err == nil {
			out[i].NextTick = sched.Next(lastTickOr(r))
		}
	}
	return out, nil
}

// lastTickOr returns the tick the next one follows: the last that fired,
// or the schedule's creation.
func lastTickOr(r store.Schedule) time.Time {
	if r.LastTick != nil {
		return *r.LastTick
	}
	return r.CreatedAt
}

// dueTicks returns the ticks of sched to fire at now, in order: those
// after the last one that are not after now. When the first of them is
// overdue by more than scheduleDowntime, they were missed while no server
// fired the schedule, and only the latest of them is returned: missed
// ticks fire once. Otherwise each fires.
func dueTicks(sched cron.Schedule, after, now time.Time) []time.Time {
	tick := sched.Next(after)
	if tick.IsZero() || tick.After(now) {
		return nil
	}
	ticks := []time.Time{tick}
	downtime := now.Sub(tick) > scheduleDowntime
	for next := sched.Next(tick); !next.IsZero() && !next.After(now); next = sched.Next(next) {
		if downtime {
			ticks[0] = next
		} else {
			ticks = append(ticks, next)
		}
	}
	return ticks
}

// registeredSchedules checks the schedules the server's behaviors declare.
func (s *Server) registeredSchedules() ([]api.Schedule, error) {
	var out []api.Schedule
	for _, b := range s.behaviors {
		for _, sc := range b.Schedules {
			if _, err := s.checkSchedule(sc); err != nil {
				return nil, fmt.Errorf("behavior %s: %w", b.ID, err)
			}
			out = append(out, sc)
		}
	}
	return out, nil
}

// scheduleLoop fires the due ticks of the schedules of the behaviors this
// server runs. Every server runs it; the compare-and-set on a schedule's
// last tick lets one of them fire each tick.
func (s *Server) scheduleLoop(ctx context.Context) {
	for {
		fctx, cancel := context.WithTimeout(ctx, dbTimeout)
		wait, err := s.fireDueTicks(fctx)
		cancel()
		if err != nil && ctx.Err() == nil && !s.inc.failed("schedule", err) {
			s.log.Warn("stint: firing schedules failed; trying again", "err", err)
		}
		if sleep(ctx, wait); ctx.Err() != nil {
			return
		}
	}
}

// fireDueTicks fires every schedule tick that is due, by the database's
// clock, and returns how long to wait until the next tick of its
// schedules falls due (at most scheduleCheck). A schedule another node
// holds, stopped inside its firing, is passed over, not waited for: its
// ticks fire once it is let go.
func (s *Server) fireDueTicks(ctx context.Context) (time.Duration, error) {
	rows, now, err := s.st.Schedules(ctx)
	read := time.Now()
	if err != nil {
		return scheduleCheck, err
	}
	wait := scheduleCheck
	for _, r := range rows {
		if !s.runsBehavior(r.Behavior) {
			continue
		}
		sched, err := parseSchedule(r.Schedule)
		if err != nil {
			continue // written by a newer version, or by hand
		}
		last, aim := r.LastTick, lastTickOr(r)
		for _, tick := range dueTicks(sched, aim, now) {
			aim = tick // fired here or elsewhere: the next look is for the one after
			var task *store.NewTask
			t, reg, err := s.prepare(api.SubmitRequest{Behavior: r.Behavior, Params: r.Params, ID: tickID(r.Name, tick)})
			if err == nil && len(t.RateUses) > 0 {
				err = s.checkRateUses(ctx, []store.NewTask{t}, []*spi.Registration{reg})
			}
			if err != nil {
				// Params stored by hand or by another version: the tick
				// passes without a task rather than being tried every second.
				s.log.Warn("stint: a schedule's task is invalid; its tick passes without one", "schedule", r.Name, "err", err)
			} else {
				t.WakeClaimers = true
				task = &t
			}
			fired, err := s.st.FireSchedule(ctx, r.Name, last, tick, task)
			if err != nil {
				return scheduleCheck, err
			}
			if !fired {
				break // another node fired it, or holds the schedule
			}
			last = &tick
		}
		if next := sched.Next(aim); !next.IsZero() {
			wait = min(wait, next.Sub(now)-time.Since(read)+scheduleMargin)
		}
	}
	return max(wait, scheduleMargin), nil
}

// runsBehavior reports whether the server runs behavior b.
func (s *Server) runsBehavior(b api.BehaviorID) bool { return s.behavior(b) != nil }
