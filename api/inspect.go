package api

import "time"

// The types of what operators read about the cluster as a whole (see the
// read methods of Operator): nodes, behavior settings, task statistics and
// change-feed filters.

// Node is a registered server node.
type Node struct {
	ID        string       `json:"id"`
	Host      string       `json:"host"`
	PID       int          `json:"pid"`
	Behaviors []BehaviorID `json:"behaviors"`
	// BehaviorVersions holds the version (spi.Policy.Version) of each
	// behavior the node runs that has one; the others are version 0.
	BehaviorVersions map[BehaviorID]int `json:"behavior_versions,omitempty"`
	MaxWorkers       int                `json:"max_workers"`
	StartedAt        time.Time          `json:"started_at"`
	HeartbeatAt      time.Time          `json:"heartbeat_at"`
	// Version is the stint version the node runs, as it registered: the
	// module version, with the commit when the build names one ("v0.6.0",
	// "v0.4.0+devel (1a2b3c4d5e6f)" for a build the toolchain did not
	// version). Empty for a node of a version that did not record it.
	Version string `json:"version,omitempty"`
	// HeartbeatAge is how long before the listing, by the database's
	// clock, the node last renewed its heartbeat.
	HeartbeatAge time.Duration `json:"-"`
	// Incidents are the database incidents going on at the node, as it
	// reported them with its last heartbeat: only those that let it write
	// its heartbeat (a failing listener) show while they last; the others
	// show as a late heartbeat, and as LastIncident once they end.
	Incidents []NodeIncident `json:"incidents,omitempty"`
	// LastIncident is the last database incident the node saw end.
	LastIncident *NodeIncident `json:"last_incident,omitempty"`
}

// NodeIncident is a database incident a node saw: a time when the
// database could not serve its calls for one cause.
type NodeIncident struct {
	// Cause is unreachable, recovery, shutdown, read_only, disk_full,
	// too_many_connections or listener.
	Cause string `json:"cause"`
	// Started is the node's time of the first failure.
	Started time.Time `json:"started"`
	// Ended is the node's time of the first success after it; zero while
	// it lasts.
	Ended time.Time `json:"ended,omitzero"`
	// Failures counts the calls that failed with this cause.
	Failures int `json:"failures"`
	// Err is the last failure's error.
	Err string `json:"error"`
}

// BehaviorSettings are a behavior's runtime settings, shared by all nodes.
type BehaviorSettings struct {
	Behavior BehaviorID `json:"behavior"`
	// Paused stops claims of the behavior on every node.
	Paused bool `json:"paused"`
	// Lease overrides the behavior's policy lease; zero keeps the policy's.
	Lease time.Duration `json:"lease,omitempty"`
}

// ChangeFilter selects change-feed entries. Zero fields select all.
type ChangeFilter struct {
	// Since is the cursor to read after; 0 reads from the start.
	Since int64
	// Limit stops reading once this many changes were read; the feed is
	// read in whole batches, so a call may return more. Defaults to 1,000.
	Limit    int
	TaskID   TaskID
	Behavior BehaviorID
	ParentID TaskID
	Status   Status
}

// Stats is a snapshot of the tasks for operators, read in one transaction
// so that its numbers agree with each other, and timed by the database's
// clock.
type Stats struct {
	// Now is the database's clock at the snapshot; on a standby that lags,
	// the time its data is as of.
	Now time.Time `json:"now"`
	// Counts are the tasks per behavior and status; absent pairs are zero.
	Counts []StatusCount `json:"counts"`
	// Due are the tasks per behavior that are due now and waiting for a
	// worker: not running, not held, not in a held group.
	Due []DueCount `json:"due"`
	// Running are the running tasks per node.
	Running []NodeRunning `json:"running"`
}

// StatusCount is the number of tasks of a behavior in a status.
type StatusCount struct {
	Behavior BehaviorID `json:"behavior"`
	Status   Status     `json:"status"`
	Count    int64      `json:"count"`
}

// DueCount is the backlog of one behavior.
type DueCount struct {
	Behavior BehaviorID `json:"behavior"`
	// Count is the number of tasks due now.
	Count int64 `json:"count"`
	// OldestAge is how long the longest-waiting of them has been due: the
	// queue lag.
	OldestAge time.Duration `json:"oldest_age"`
}

// NodeRunning counts the running tasks of one node.
type NodeRunning struct {
	Node string `json:"node"`
	// Running is the number of tasks whose lease the node holds.
	Running int64 `json:"running"`
	// Expired is how many of them have an expired lease: tasks of a node
	// that stopped renewing, waiting to be taken over.
	Expired int64 `json:"expired"`
}
