package store

import "github.com/stinthq/stint/api"

// The store reads and writes the operator's types of the api package as
// they are; these names keep its signatures short.
type (
	// Node is a registered server node.
	Node = api.Node
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
