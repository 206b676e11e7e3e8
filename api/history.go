package api

import "time"

// HistoryBucket is the width of one point of the history: the database
// keeps what each behavior did per minute.
const HistoryBucket = time.Minute

// HistoryRetention is how long the database keeps the history. Server
// upkeep deletes older points.
const HistoryRetention = 24 * time.Hour

// History is what the behaviors did over a window of time, as the
// database keeps it, for charts that every dashboard draws alike and that
// survive a restart of the node that serves them.
type History struct {
	// Now is the database's clock when the history was read.
	Now time.Time `json:"now"`
	// From is the start of the first bucket in the window.
	From time.Time `json:"from"`
	// Bucket is the width of one point: HistoryBucket.
	Bucket time.Duration `json:"bucket"`
	// Points are the buckets with anything recorded, by behavior and then
	// time. A bucket with no point is one in which no run of the behavior
	// ended and no sample was taken.
	Points []HistoryPoint `json:"points"`
}

// HistoryPoint is what one behavior did in one bucket.
type HistoryPoint struct {
	Behavior BehaviorID `json:"behavior"`
	// At is the start of the bucket.
	At time.Time `json:"at"`
	// Succeeded and Failed count the runs that ended in the bucket, as
	// the nodes recorded them, and Failed also the tasks failed by hand
	// (Operator.Fail); Retried counts those of the failed runs whose task
	// runs again (a retry). Failed minus Retried is the tasks that ended
	// failed for good.
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
	Retried   int64 `json:"retried"`
	// Sampled tells that Due and QueueLag were sampled in the bucket
	// (every 10 seconds while a server node is up); a bucket in which no
	// server node was up has no sample.
	Sampled bool `json:"sampled"`
	// Due is the most tasks that were due and waiting for a worker at
	// one of the bucket's samples, as Stats.Due counts them.
	Due int64 `json:"due"`
	// QueueLag is the longest any of them had been due at a sample.
	QueueLag time.Duration `json:"queue_lag"`
}
