package web

import (
	"context"
	"errors"
	"net/http"
	"net/url"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// RewindBody is the body of POST /api/v1/tasks/{id}/rewind.
type RewindBody struct {
	// Step is the step the task runs again from (api.Task.Steps), from 1.
	// Required.
	Step int `json:"step"`
}

// ForkBody is the body of POST /api/v1/tasks/{id}/fork.
type ForkBody struct {
	// Step is the step of the task the copy starts from, from 1.
	// Required.
	Step int `json:"step"`
	// ID is the new task's id. Required.
	ID api.TaskID `json:"id"`
}

// rewindTask runs a finished task again from one of its steps and
// answers with its state after.
func (h *Handler) rewindTask(w http.ResponseWriter, r *http.Request) error {
	if _, err := Query(r); err != nil {
		return err
	}
	var body RewindBody
	if err := decodeBody(w, r, &body); err != nil {
		return err
	}
	id := api.TaskID(r.PathValue("id"))
	if err := h.cfg.Client.Rewind(r.Context(), id, body.Step); err != nil {
		return stepError(id, "rewind", err)
	}
	// The answer is the task's state after, as of every task action.
	done := func(context.Context, api.TaskID) error { return nil }
	return h.taskAction("rewind", done)(w, r)
}

// forkTask submits a copy of a task started from one of its steps: 201
// with the new task's submission.
func (h *Handler) forkTask(w http.ResponseWriter, r *http.Request) error {
	if _, err := Query(r); err != nil {
		return err
	}
	var body ForkBody
	if err := decodeBody(w, r, &body); err != nil {
		return err
	}
	if err := spi.CheckTaskID("id", body.ID); err != nil {
		return err
	}
	id := api.TaskID(r.PathValue("id"))
	sub, err := h.cfg.Client.Fork(r.Context(), id, body.Step, body.ID)
	if err != nil {
		return stepError(id, "fork", err)
	}
	h.invalidateStats()
	w.Header().Set("Location", apiPrefix+"/tasks/"+url.PathEscape(string(sub.ID)))
	WriteJSON(w, http.StatusCreated, sub)
	return nil
}

// stepError is the error of a rewind or a fork (verb) of task id: a
// missing step is a 404 that names it, the rest as TaskError says.
func stepError(id api.TaskID, verb string, err error) error {
	if errors.Is(err, api.ErrNotFound) && err != api.ErrNotFound {
		return notFound("%s", err.Error())
	}
	return TaskError(id, verb, err)
}
