package ingest

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/web"
)

// Feature is the dashboard feature of Routes: with it in
// web.Config.Features, the dashboard shows its batch pages.
const Feature = "batches"

// BatchesResponse is the answer of GET /api/v1/batches.
type BatchesResponse struct {
	// Batches have their counts of jobs by Merritt state, not the jobs.
	Batches []BatchView `json:"batches"`
	// Next is the cursor of the next page (after=Next); empty on the last.
	Next api.TaskID `json:"next,omitempty"`
}

// Routes returns the endpoints of the ingest batches and jobs, for
// web.Config.Routes (with Feature in web.Config.Features): the dashboard
// learns of a behavior's views through them, and web imports no behavior.
//
//	GET /api/v1/batches        read  ?profile=P&after=ID&limit=N: a page of batches in id order
//	GET /api/v1/batches/{id}   read  a batch with its jobs, their counts by state, its report, notices and history
//	GET /api/v1/jobs/{id}      read  a job with its Merritt state
//
// and the Merritt actions, which follow the state table of batches and jobs
// (an action the state does not allow is a 409):
//
//	POST   /api/v1/batches/{id}/requeue   admin  requeue the Failed jobs and report again: {"requeued": [ids]}
//	POST   /api/v1/batches/{id}/hold      admin  Pending -> Held; also release (Held -> Pending)
//	DELETE /api/v1/batches/{id}           admin  delete a Held, Failed or Completed batch with its jobs: 204
//
// and the same under /api/v1/jobs/{id} for one job. Holds of a whole
// profile are the group endpoints'.
func Routes(admin *Admin) []web.Route {
	routes := []web.Route{
		{Pattern: "GET /batches", Role: web.RoleRead, Handle: func(w http.ResponseWriter, r *http.Request) error {
			q, err := web.Query(r, "profile", "after", "limit")
			if err != nil {
				return err
			}
			profile, after := q.Get("profile"), api.TaskID(q.Get("after"))
			if q.Has("profile") {
				if err := spi.CheckGroupKey("profile", profile); err != nil {
					return err
				}
			}
			if after != "" {
				if err := spi.CheckTaskID("after", after); err != nil {
					return err
				}
			}
			limit := 50
			if s := q.Get("limit"); s != "" {
				if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > 1000 {
					return api.Invalid("limit", "%q is not a number from 1 to 1000", s)
				}
			}
			batches, next, err := admin.Batches(r.Context(), profile, after, limit)
			if err != nil {
				return fmt.Errorf("list batches: %w", err)
			}
			web.WriteJSON(w, http.StatusOK, BatchesResponse{Batches: batches, Next: next})
			return nil
		}},
		{Pattern: "GET /batches/{id}", Role: web.RoleRead, Handle: func(w http.ResponseWriter, r *http.Request) error {
			id := api.TaskID(r.PathValue("id"))
			v, err := admin.Batch(r.Context(), id)
			if err != nil {
				return web.TaskError(id, "get batch", err)
			}
			web.WriteJSON(w, http.StatusOK, v)
			return nil
		}},
		{Pattern: "GET /jobs/{id}", Role: web.RoleRead, Handle: func(w http.ResponseWriter, r *http.Request) error {
			id := api.TaskID(r.PathValue("id"))
			v, err := admin.Job(r.Context(), id)
			if err != nil {
				return web.TaskError(id, "get job", err)
			}
			web.WriteJSON(w, http.StatusOK, v)
			return nil
		}},
	}
	for _, kind := range []string{"batch", "job"} {
		routes = append(routes, actionRoutes(admin, kind)...)
	}
	return routes
}

// RequeueResponse is the answer of POST /api/v1/batches/{id}/requeue and
// /jobs/{id}/requeue.
type RequeueResponse struct {
	// Requeued are the jobs requeued.
	Requeued []api.TaskID `json:"requeued"`
}

// batchActionRoutes returns the admin actions on a batch or a job (kind
// "batch" or "job"). Hold and release answer with the batch or job after
// the action.
func actionRoutes(admin *Admin, kind string) []web.Route {
	base := "/" + kind + "es/{id}"
	get := func(ctx context.Context, id api.TaskID) (any, error) { return admin.Batch(ctx, id) }
	if kind == "job" {
		base = "/jobs/{id}"
		get = func(ctx context.Context, id api.TaskID) (any, error) { return admin.Job(ctx, id) }
	}
	// check refuses an id of the other kind before acting, as the GET
	// endpoints do.
	check := func(r *http.Request) (api.TaskID, error) {
		id := api.TaskID(r.PathValue("id"))
		if _, err := get(r.Context(), id); err != nil {
			return id, web.TaskError(id, "get "+kind, err)
		}
		return id, nil
	}
	state := func(verb string, do func(context.Context, api.TaskID) error) func(http.ResponseWriter, *http.Request) error {
		return func(w http.ResponseWriter, r *http.Request) error {
			id, err := check(r)
			if err != nil {
				return err
			}
			if err := do(r.Context(), id); err != nil {
				return web.TaskError(id, verb+" "+kind, err)
			}
			v, err := get(r.Context(), id)
			if err != nil {
				return web.TaskError(id, "get "+kind, err)
			}
			web.WriteJSON(w, http.StatusOK, v)
			return nil
		}
	}
	return []web.Route{
		{Pattern: "POST " + base + "/requeue", Role: web.RoleAdmin, Handle: func(w http.ResponseWriter, r *http.Request) error {
			id, err := check(r)
			if err != nil {
				return err
			}
			requeued, err := admin.Requeue(r.Context(), id)
			if err != nil {
				return web.TaskError(id, "requeue "+kind, err)
			}
			if requeued == nil {
				requeued = []api.TaskID{}
			}
			web.WriteJSON(w, http.StatusOK, RequeueResponse{Requeued: requeued})
			return nil
		}},
		{Pattern: "POST " + base + "/hold", Role: web.RoleAdmin, Handle: state("hold", admin.Hold)},
		{Pattern: "POST " + base + "/release", Role: web.RoleAdmin, Handle: state("release", admin.Release)},
		{Pattern: "DELETE " + base, Role: web.RoleAdmin, Handle: func(w http.ResponseWriter, r *http.Request) error {
			id, err := check(r)
			if err != nil {
				return err
			}
			if err := admin.Delete(r.Context(), id); err != nil {
				return web.TaskError(id, "delete "+kind, err)
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
	}
}
