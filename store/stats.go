package store

import "github.com/stinthq/stint/api"

// The store reads and writes the operator's types of the api package as
// they are; these names keep its signatures short.
type (
	// Node is a registered server node.
	Node = api.Node
	// NodeIncident is a database incident a node saw.
	NodeIncident = api.NodeIncident
	// BehaviorSettings are a behavior's runtime settings.
	BehaviorSettings = api.BehaviorSettings
	// ChangeFilter selects change-feed entries.
	ChangeFilter = api.ChangeFilter
	// Stats is a snapshot of the tasks for operators.
	Stats = api.Stats
	// StatusCount is the number of tasks of a behavior in a status.
	StatusCount = api.StatusCount
	// DueCount is the backlog of one behavior.
	DueCount = api.DueCount
	// NodeRunning counts the running tasks of one node.
	NodeRunning = api.NodeRunning
)

// HistoryCount is the runs of one behavior that a node saw end since its
// last record of the history.
type HistoryCount struct {
	Behavior api.BehaviorID
	// Succeeded and Failed count the runs that ended so; Retried counts
	// those of the failed whose task runs again.
	Succeeded, Failed, Retried int64
}

// HistoryRecord is what a node adds to the history: its run ends, and
// whether it offers to sample the backlog.
type HistoryRecord struct {
	Counts []HistoryCount
	// Sample asks to sample the due backlog and queue lag, unless a node
	// did already in the current 10-second slot.
	Sample bool
	// Behaviors are sampled with a zero backlog when none of their tasks
	// is due, so that their charts show the zero rather than a gap.
	Behaviors []api.BehaviorID
}

// NodeHealth is what a node reports of its database incidents with its
// heartbeat: those going on, and the last one that ended (nil if none).
type NodeHealth struct {
	Incidents []NodeIncident
	Last      *NodeIncident
}
