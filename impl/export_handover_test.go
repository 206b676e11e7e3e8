package impl

// HandedOver returns how many tasks the hand-overs of s's finishes
// started (see Server.handsOver).
func HandedOver(s *Server) int64 { return s.handedOver.Load() }
