package web

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// WorkflowBody is the body of POST /workflows.
type WorkflowBody struct {
	// ID names the workflow; absent generates one.
	ID api.TaskID `json:"id,omitempty"`
	// Nodes are the workflow's tasks.
	Nodes []WorkflowNodeBody `json:"nodes"`
	// Retention keeps the workflow with its nodes this long after it
	// ended, as a duration such as "24h"; absent for stint.workflow's.
	Retention string `json:"retention,omitempty"`
}

// WorkflowNodeBody is a node of a WorkflowBody: api.WorkflowNode with its
// task as the body of POST /tasks (durations as strings such as "90s").
type WorkflowNodeBody struct {
	Name      string     `json:"name"`
	Task      SubmitBody `json:"task"`
	DependsOn []string   `json:"depends_on,omitempty"`
	Rule      api.Rule   `json:"rule,omitempty"`
	Finally   bool       `json:"finally,omitempty"`
	// Workflow makes the node run this workflow, a sub-workflow
	// (api.WorkflowNode.Workflow).
	Workflow *WorkflowBody `json:"workflow,omitempty"`
	// Gate makes the node wait for a signal instead of running a behavior
	// (api.WorkflowNode.Gate): {"topic": "approval", "timeout": "72h"}.
	Gate *api.Gate `json:"gate,omitempty"`
}

// Request returns the workflow request of b. A duration that does not
// parse is an error wrapping api.ErrInvalid that names its field.
func (b WorkflowBody) Request() (api.WorkflowRequest, error) { return b.request("") }

// request is Request for the workflow at field, a prefix of the fields
// its errors name.
func (b WorkflowBody) request(field string) (api.WorkflowRequest, error) {
	req := api.WorkflowRequest{ID: b.ID, Nodes: make([]api.WorkflowNode, len(b.Nodes))}
	if b.Retention != "" {
		d, err := time.ParseDuration(b.Retention)
		if err != nil {
			return req, invalid(field+"retention", "%q is not a duration such as \"24h\"", b.Retention)
		}
		req.Retention = d
	}
	for i, n := range b.Nodes {
		task, err := n.Task.request(fmt.Sprintf("%snodes[%d].task.", field, i))
		if err != nil {
			return req, err
		}
		req.Nodes[i] = api.WorkflowNode{Name: n.Name, Task: task, DependsOn: n.DependsOn, Rule: n.Rule, Finally: n.Finally, Gate: n.Gate}
		if n.Workflow != nil {
			sub, err := n.Workflow.request(fmt.Sprintf("%snodes[%d].workflow.", field, i))
			if err != nil {
				return req, err
			}
			req.Nodes[i].Workflow = &sub
		}
	}
	return req, nil
}

func (h *Handler) submitWorkflow(w http.ResponseWriter, r *http.Request) error {
	if _, err := Query(r); err != nil {
		return err
	}
	raw, err := readBody(w, r, MaxWorkflowBody)
	if err != nil {
		return err
	}
	var body WorkflowBody
	if err := decodeJSON(raw, &body); err != nil {
		return err
	}
	req, err := body.Request()
	if err != nil {
		return err
	}
	sub, err := h.cfg.Client.SubmitWorkflow(r.Context(), req)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if sub.Created {
		status = http.StatusCreated
	}
	w.Header().Set("Location", apiPrefix+"/workflows/"+url.PathEscape(string(sub.ID)))
	WriteJSON(w, status, sub)
	return nil
}

// workflowFilterFromQuery reads the filters of GET /workflows.
func workflowFilterFromQuery(q url.Values) (api.WorkflowFilter, error) {
	f := api.WorkflowFilter{State: api.WorkflowState(q.Get("state")), After: api.TaskID(q.Get("after"))}
	if q.Has("state") && !f.State.Valid() {
		return f, invalid("state", "%q is not a workflow state: want running, succeeded, failed or cancelled", q.Get("state"))
	}
	if f.After != "" {
		if err := spi.CheckTaskID("after", f.After); err != nil {
			return f, err
		}
	}
	var err error
	f.Limit, err = limitFromQuery(q)
	return f, err
}

func (h *Handler) listWorkflows(w http.ResponseWriter, r *http.Request) error {
	q, err := Query(r, "state", "after", "limit")
	if err != nil {
		return err
	}
	f, err := workflowFilterFromQuery(q)
	if err != nil {
		return err
	}
	page, err := h.cfg.Client.ListWorkflows(r.Context(), f)
	if err != nil {
		return fmt.Errorf("list workflows: %w", err)
	}
	WriteJSON(w, http.StatusOK, page)
	return nil
}

func (h *Handler) getWorkflow(w http.ResponseWriter, r *http.Request) error {
	id := api.TaskID(r.PathValue("id"))
	wf, err := h.cfg.Client.GetWorkflow(r.Context(), id)
	if err != nil {
		return workflowError(id, "get", err)
	}
	for i := range wf.Nodes {
		h.cfg.Registry.RedactTask(&wf.Nodes[i].Task) // no password is ever shown
	}
	WriteJSON(w, http.StatusOK, wf)
	return nil
}

func (h *Handler) cancelWorkflow(w http.ResponseWriter, r *http.Request) error {
	return h.workflowAction(w, r, "cancel", h.cfg.Client.CancelWorkflow)
}

func (h *Handler) retryWorkflow(w http.ResponseWriter, r *http.Request) error {
	return h.workflowAction(w, r, "retry", h.cfg.Client.RetryWorkflow)
}

func (h *Handler) holdWorkflow(w http.ResponseWriter, r *http.Request) error {
	return h.workflowAction(w, r, "hold", h.cfg.Client.HoldWorkflow)
}

func (h *Handler) releaseWorkflow(w http.ResponseWriter, r *http.Request) error {
	return h.workflowAction(w, r, "release", h.cfg.Client.ReleaseWorkflow)
}

func (h *Handler) removeWorkflow(w http.ResponseWriter, r *http.Request) error {
	return h.workflowAction(w, r, "remove", h.cfg.Client.RemoveWorkflow)
}

// workflowAction answers an action on the workflow the path names: act
// on it, then 204 No Content.
func (h *Handler) workflowAction(w http.ResponseWriter, r *http.Request, verb string, act func(context.Context, api.TaskID) error) error {
	id := api.TaskID(r.PathValue("id"))
	if err := act(r.Context(), id); err != nil {
		return workflowError(id, verb, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
