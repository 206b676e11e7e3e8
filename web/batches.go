package web

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/ingest"
	"github.com/stinthq/stint/spi"
)

// FeatureBatches is the feature of BatchRoutes: with it in
// Config.Features, the dashboard shows its batch pages.
const FeatureBatches = "batches"

// BatchesResponse is the answer of GET /api/v1/batches.
type BatchesResponse struct {
	// Batches have their counts of jobs by Merritt state, not the jobs.
	Batches []ingest.BatchView `json:"batches"`
	// Next is the cursor of the next page (after=Next); empty on the last.
	Next api.TaskID `json:"next,omitempty"`
}

// BatchRoutes returns the endpoints of the ingest batches and jobs, for
// Config.Routes (with FeatureBatches in Config.Features):
//
//	GET /api/v1/batches        read  ?profile=P&after=ID&limit=N: a page of batches in id order
//	GET /api/v1/batches/{id}   read  a batch with its jobs, their counts by state, its report and history
//	GET /api/v1/jobs/{id}      read  a job with its Merritt state
//
// The actions on batches and jobs are the task endpoints': hold, release,
// retry and remove, and holds of a profile's group.
func BatchRoutes(admin *ingest.Admin) []Route {
	return []Route{
		{Pattern: "GET /batches", Role: RoleRead, Handle: func(w http.ResponseWriter, r *http.Request) error {
			q, err := Query(r, "profile", "after", "limit")
			if err != nil {
				return err
			}
			profile, after := q.Get("profile"), api.TaskID(q.Get("after"))
			if q.Has("profile") && !validGroupKey(profile) {
				return invalid("profile", "must be 1 to 256 printable UTF-8 bytes")
			}
			if after != "" {
				if err := spi.CheckTaskID("after", after); err != nil {
					return err
				}
			}
			limit := 50
			if s := q.Get("limit"); s != "" {
				if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > 1000 {
					return invalid("limit", "%q is not a number from 1 to 1000", s)
				}
			}
			batches, next, err := admin.Batches(r.Context(), profile, after, limit)
			if err != nil {
				return fmt.Errorf("list batches: %w", err)
			}
			WriteJSON(w, http.StatusOK, BatchesResponse{Batches: batches, Next: next})
			return nil
		}},
		{Pattern: "GET /batches/{id}", Role: RoleRead, Handle: func(w http.ResponseWriter, r *http.Request) error {
			id := api.TaskID(r.PathValue("id"))
			v, err := admin.Batch(r.Context(), id)
			if err != nil {
				return taskError(id, "get batch", err)
			}
			WriteJSON(w, http.StatusOK, v)
			return nil
		}},
		{Pattern: "GET /jobs/{id}", Role: RoleRead, Handle: func(w http.ResponseWriter, r *http.Request) error {
			id := api.TaskID(r.PathValue("id"))
			v, err := admin.Job(r.Context(), id)
			if err != nil {
				return taskError(id, "get job", err)
			}
			WriteJSON(w, http.StatusOK, v)
			return nil
		}},
	}
}
