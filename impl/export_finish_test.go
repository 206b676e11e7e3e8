package impl

import "time"

// SetFinishTimeout sets the deadline of the first try of s's finishes,
// for tests that make a finish outrun it. Call it after Start, before a
// run of the test ends.
func SetFinishTimeout(s *Server, d time.Duration) { s.completer.timeout = d }
