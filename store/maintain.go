package store

import (
	"time"

	"github.com/stinthq/stint/api"
)

// FeedConsumer is a named reader of the change feed.
type FeedConsumer struct {
	Name string `json:"name"`
	// Cursor is where the consumer has read to.
	Cursor      int64     `json:"cursor"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
}

// MaintainParams bound what Maintain keeps.
type MaintainParams struct {
	// ConsumerTimeout drops feed consumers silent this long.
	ConsumerTimeout time.Duration
	// NodeTimeout drops nodes whose heartbeat is this old.
	NodeTimeout time.Duration
	// FeedMinRetention keeps every change this long, read or not.
	FeedMinRetention time.Duration
	// FeedMaxRetention drops changes this old even if a live consumer has
	// not read them.
	FeedMaxRetention time.Duration
	// Batch caps the changes deleted by one call.
	Batch int
}

// MaintainResult says what Maintain removed.
type MaintainResult struct {
	Consumers, Nodes, Changes int
}

// DeleteFinishedParams select finished tasks to delete.
type DeleteFinishedParams struct {
	Behavior  api.BehaviorID
	Status    api.Status // StatusSuccess or StatusFailure
	OlderThan time.Duration
	Limit     int
}
