package impl

import (
	"time"

	"github.com/stinthq/stint/api"
)

// KickWindow returns the window within which c's submits share one due
// notification (and one more at the window's end), for tests that bound the
// notifications by the time their submits took.
func KickWindow(c *Client) time.Duration { return c.kick.window }

// FlushKicks waits for c's trailing due notifications to go out.
func FlushKicks(c *Client) { c.kick.flush() }

// ClaimersDone returns the channel closed once s's claimers have stopped
// (Stop stops them first, then waits for the runs).
func ClaimersDone(s *Server) <-chan struct{} { return s.claimDone }

// CoalesceWaiting returns how many of c's single submits wait in batches
// not sent yet (callers that gave up left out).
func CoalesceWaiting(c *Client) int { return c.coalesce.waiting() }

// ClaimsInFlight returns how many claim statements of s are under way.
func ClaimsInFlight(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claiming
}

// Listening reports whether s's listening connection listens now: a
// notification sent before it does is lost to s (its renewals find out,
// a third of a lease later).
func Listening(s *Server) bool { return s.hub.listening.Load() }

// OnSubworkflowSubmitted has f called once a run of a sub-workflow node
// submitted its sub-workflow, with whether the submit created it; an
// error f returns ends the run. It returns the function that undoes it.
func OnSubworkflowSubmitted(f func(node api.TaskID, created bool) error) func() {
	subworkflowSubmitted.Store(&f)
	return func() { subworkflowSubmitted.Store(nil) }
}

// SignalsWaiting returns how many of c's Signals wait in batches not sent
// yet (callers that gave up left out).
func SignalsWaiting(c *Client) int { return c.signals.waiting() }
