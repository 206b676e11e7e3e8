package web

import (
	"fmt"
	"net/http"
	"time"

	"github.com/stinthq/stint/api"
)

// defaultHistoryWindow is the window GET /history reads unless told.
const defaultHistoryWindow = time.Hour

// HistoryResponse is the answer of GET /history: what each behavior did
// per bucket over the window, as the database keeps it.
type HistoryResponse struct {
	// Now is the database's clock when the history was read.
	Now time.Time `json:"now"`
	// From is the start of the window's first bucket.
	From time.Time `json:"from"`
	// BucketSeconds is the width of a point.
	BucketSeconds int `json:"bucket_seconds"`
	// Behaviors are those with any point in the window, by name.
	Behaviors []BehaviorHistory `json:"behaviors"`
}

// BehaviorHistory is one behavior's points, oldest first. A bucket with
// no point had no run end and no sample.
type BehaviorHistory struct {
	Behavior api.BehaviorID `json:"behavior"`
	Points   []HistoryPoint `json:"points"`
}

// HistoryPoint is one bucket of a behavior's history.
type HistoryPoint struct {
	// At is the start of the bucket.
	At time.Time `json:"at"`
	// Succeeded and Failed count the runs that ended in the bucket, and
	// Failed the tasks failed by hand too; Retried, those of the failed
	// whose task runs again. Failed minus Retried is the tasks that ended
	// failed for good.
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
	Retried   int64 `json:"retried"`
	// Sampled tells whether Due and QueueLagMS were sampled in the bucket
	// (every 10 seconds while a server node is up).
	Sampled bool `json:"sampled"`
	// Due is the most tasks due and waiting for a worker at one of the
	// bucket's samples.
	Due int64 `json:"due"`
	// QueueLagMS is the longest any of them had been due at a sample.
	QueueLagMS int64 `json:"queue_lag_ms"`
}

// history serves GET /history?window=DURATION (1m to 24h; default 1h).
func (h *Handler) history(w http.ResponseWriter, r *http.Request) error {
	q, err := Query(r, "window")
	if err != nil {
		return err
	}
	window := defaultHistoryWindow
	if s := q.Get("window"); s != "" {
		window, err = time.ParseDuration(s)
		if err != nil || window < api.HistoryBucket || window > api.HistoryRetention {
			return invalid("window", "%q is not a duration from %s to %s", s, api.HistoryBucket, api.HistoryRetention)
		}
	}
	hist, err := h.cfg.Client.History(r.Context(), window)
	if err != nil {
		return fmt.Errorf("read history: %w", err)
	}
	resp := HistoryResponse{Now: hist.Now, From: hist.From, BucketSeconds: int(hist.Bucket / time.Second), Behaviors: []BehaviorHistory{}}
	for _, p := range hist.Points {
		if n := len(resp.Behaviors); n == 0 || resp.Behaviors[n-1].Behavior != p.Behavior {
			resp.Behaviors = append(resp.Behaviors, BehaviorHistory{Behavior: p.Behavior})
		}
		b := &resp.Behaviors[len(resp.Behaviors)-1]
		b.Points = append(b.Points, HistoryPoint{At: p.At, Succeeded: p.Succeeded, Failed: p.Failed, Retried: p.Retried,
			Sampled: p.Sampled, Due: p.Due, QueueLagMS: p.QueueLag.Milliseconds()})
	}
	WriteJSON(w, http.StatusOK, resp)
	return nil
}
