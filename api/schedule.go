package api

import (
	"encoding/json"
	"time"
)

// Schedule fires a task of a behavior periodically. Each tick fires
// exactly once across all nodes, every tick that falls while a node that
// runs the behavior is up. After downtime (a tick overdue by more than ten
// seconds), the missed ticks fire once, as the latest of them, not one
// task each: a schedule says how often work should run, and a backlog of
// identical runs is rarely what its owner wants.
type Schedule struct {
	// Name identifies the schedule: 1 to 64 characters from [a-z0-9._-],
	// starting with a letter or digit.
	Name string `json:"name"`
	// Behavior is the behavior of the tasks it fires.
	Behavior BehaviorID `json:"behavior"`
	// Spec is a cron expression of five fields (minute hour day-of-month
	// month day-of-week), a descriptor (@hourly, @daily, @weekly, @monthly,
	// @yearly), or "@every D" with a Go duration D of at least a second.
	Spec string `json:"spec"`
	// TimeZone is the IANA time zone the cron fields are read in.
	// Defaults to UTC.
	TimeZone string `json:"time_zone,omitempty"`
	// Params are the params of every task it fires. Empty means {}.
	Params json.RawMessage `json:"params,omitempty"`
}

// ScheduleInfo is a stored schedule and when it fires next.
type ScheduleInfo struct {
	Schedule
	// Registered is set for a schedule a behavior declares; it is written
	// by the nodes that run the behavior. Others were added at runtime.
	Registered bool `json:"registered"`
	// LastTick is the tick that fired last; nil before the first.
	LastTick *time.Time `json:"last_tick,omitempty"`
	// NextTick is the next tick to fire.
	NextTick  time.Time `json:"next_tick"`
	CreatedAt time.Time `json:"created_at"`
}
