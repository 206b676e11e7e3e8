package spi

import "github.com/stinthq/stint/api"

// Scheduler is implemented by behaviors that run on a schedule: the
// schedules they return are stored by every server that runs the
// behavior when it starts, and fire whether or not anyone submits. The
// Behavior field of each may be left empty: it is the behavior's.
type Scheduler interface {
	Schedules() []api.Schedule
}
