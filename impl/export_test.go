package impl

import "time"

// KickWindow returns the window within which c's submits share one due
// notification (and one more at the window's end), for tests that bound the
// notifications by the time their submits took.
func KickWindow(c *Client) time.Duration { return c.kick.window }

// FlushKicks waits for c's trailing due notifications to go out.
func FlushKicks(c *Client) { c.kick.flush() }

// ClaimersDone returns the channel closed once s's claimers have stopped
// (Stop stops them first, then waits for the runs).
func ClaimersDone(s *Server) <-chan struct{} { return s.claimDone }
