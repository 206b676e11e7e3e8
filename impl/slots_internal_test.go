package impl

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// TestSlots walks the slot bookkeeping through claims and run ends of a
// capped and an uncapped behavior: reservations never exceed the free
// slots or a cap, and every count returns to zero.
func TestSlots(t *testing.T) {
	t.Parallel()
	policies := map[api.BehaviorID]spi.Policy{
		"capped": {MaxConcurrency: 2},
		"free":   {},
	}
	policy := func(b api.BehaviorID) spi.Policy { return policies[b] }
	s := newSlots(5)
	claimed := func(b api.BehaviorID, n int) []store.Claimed {
		out := make([]store.Claimed, n)
		for i := range out {
			out[i].Behavior = b
		}
		return out
	}

	// A claim of the capped behavior reserves no more than its cap.
	require.Equal(t, 2, s.reserve(10, []api.BehaviorID{"capped"}, policy))
	require.Equal(t, 0, s.reserve(10, []api.BehaviorID{"capped"}, policy), "the cap is reserved")
	// Another claim takes the rest of the node's slots.
	require.Equal(t, 3, s.reserve(10, nil, policy))
	require.Equal(t, 0, s.free())
	require.Equal(t, 0, s.running(), "reserved slots hold no run yet")

	// The capped claim filled one slot, the other claim two.
	s.unreserve(2, []api.BehaviorID{"capped"}, claimed("capped", 1))
	s.unreserve(3, nil, claimed("free", 2))
	require.Equal(t, 3, s.running())
	require.Equal(t, 2, s.free())
	left, capped := s.left("capped", policies["capped"], s.free())
	require.True(t, capped)
	require.Equal(t, 1, left, "one run of the capped behavior, one left")
	left, capped = s.left("free", policies["free"], s.free())
	require.False(t, capped)
	require.Equal(t, 2, left)

	// Runs end: every count is back to zero, none below.
	s.release("capped", policies["capped"])
	s.release("free", policies["free"])
	s.release("free", policies["free"])
	require.Equal(t, 5, s.free())
	require.Equal(t, 0, s.running())
	require.Equal(t, map[api.BehaviorID]int{"capped": 0}, s.capped, "an uncapped behavior is not counted, so never negative")
}
