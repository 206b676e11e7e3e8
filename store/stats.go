package store

import (
	"time"

	"github.com/stinthq/stint/api"
)

// Stats is a snapshot of the tasks for operators, read in one transaction
// so that its numbers agree with each other, and timed by the database's
// clock.
type Stats struct {
	// Now is the database's clock at the snapshot.
	Now time.Time
	// Counts are the tasks per behavior and status; absent pairs are zero.
	Counts []StatusCount
	// Due are the tasks per behavior that are due now and waiting for a
	// worker: not running, not held, not in a held group.
	Due []DueCount
	// Running are the running tasks per node.
	Running []NodeRunning
}

// StatusCount is the number of tasks of a behavior in a status.
type StatusCount struct {
	Behavior api.BehaviorID
	Status   api.Status
	Count    int64
}

// DueCount is the backlog of one behavior.
type DueCount struct {
	Behavior api.BehaviorID
	// Count is the number of tasks due now.
	Count int64
	// OldestAge is how long the longest-waiting of them has been due: the
	// queue lag.
	OldestAge time.Duration
}

// NodeRunning counts the running tasks of one node.
type NodeRunning struct {
	Node string
	// Running is the number of tasks whose lease the node holds.
	Running int64
	// Expired is how many of them have an expired lease: tasks of a node
	// that stopped renewing, waiting to be taken over.
	Expired int64
}
