package impl

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// TestABusyClaimLeavesOutTheIdleGroups checks which claim groups a claim
// asks: a claim that follows a busy group's leaves out a group whose last
// claim found nothing, until a wake-up or a poll interval after; a claim
// that finds tasks makes its group busy again.
func TestABusyClaimLeavesOutTheIdleGroups(t *testing.T) {
	t.Parallel()
	reg := spi.NewRegistry()
	s := &Server{slots: newSlots(10), claimReturned: make(chan struct{}), cfg: ServerConfig{PollInterval: time.Hour, Registry: reg}}
	for _, b := range []noopBehavior{{"plain", spi.Policy{}}, {"capped", spi.Policy{ClusterConcurrency: 5}}} {
		require.NoError(t, spi.Register(reg, b))
		r, _ := reg.Lookup(b.id)
		s.behaviors = append(s.behaviors, r)
	}
	// claim runs one claim of the groups asked, each finding as many
	// tasks as found says (runs that end at once), and returns the keys of
	// the groups asked: "" for the main one.
	claim := func(woken bool, found map[string]int) []string {
		var asked []string
		for _, g := range s.activeGroups(s.claimGroups(nil), woken) {
			g, ok, _ := s.reserve(g)
			require.True(t, ok)
			claimed := make([]store.Claimed, found[g.key()])
			for i := range claimed {
				claimed[i].Behavior = g.behaviors[0].Behavior
			}
			s.unreserve(g, claimed, true, false)
			s.slots.taken -= len(claimed)
			asked = append(asked, g.key())
		}
		return asked
	}

	require.Equal(t, []string{"", "capped"}, claim(true, map[string]int{"": 3}), "a wake-up asks every group")
	require.Equal(t, []string{""}, claim(false, map[string]int{"": 3}), "capped found nothing: the busy group only")
	require.Equal(t, []string{""}, claim(false, nil))
	require.Empty(t, claim(false, nil), "neither found anything")
	require.Equal(t, []string{"", "capped"}, claim(true, map[string]int{"capped": 1}))
	require.Equal(t, []string{"capped"}, claim(false, map[string]int{"capped": 1}), "the main group found nothing at the wake-up")

	s.cfg.PollInterval = time.Millisecond
	require.Eventually(t, func() bool { return len(claim(false, nil)) == 2 }, time.Minute, time.Millisecond,
		"a poll interval after a group found nothing, it is asked again")
}

// noopBehavior is a behavior of its own id and policy that does nothing.
type noopBehavior struct {
	id  api.BehaviorID
	pol spi.Policy
}

func (b noopBehavior) Kind() api.Kind[struct{}, struct{}] {
	return api.Kind[struct{}, struct{}]{ID: b.id}
}
func (noopBehavior) TaskID(ids spi.IDs, _ struct{}) api.TaskID { return ids.Unique() }
func (b noopBehavior) Policy() spi.Policy                      { return b.pol }
func (noopBehavior) Run(context.Context, spi.RunContext, struct{}) (struct{}, error) {
	return struct{}{}, nil
}

// TestAClaimHeldBackByAnotherClaimerIsNotLeftIdle checks the two ways a
// claimer found no room for a behavior at its cap on this node while the
// other claimer's claim of the main group held most slots, and waited for
// its poll (ten minutes, in TestAFullBehaviorIsClaimedAgainWhenARunEnds)
// with the behavior's tasks due: the behavior joined the main group, which
// was left out as found empty; or its claim reserved nothing, and no end
// of a run said when to claim again.
func TestAClaimHeldBackByAnotherClaimerIsNotLeftIdle(t *testing.T) {
	t.Parallel()
	reg := spi.NewRegistry()
	s := &Server{slots: newSlots(10), claimReturned: make(chan struct{}), cfg: ServerConfig{PollInterval: time.Hour, Registry: reg}}
	for _, b := range []noopBehavior{{"plain", spi.Policy{}}, {"full", spi.Policy{MaxConcurrency: 4}}} {
		require.NoError(t, spi.Register(reg, b))
		r, _ := reg.Lookup(b.id)
		s.behaviors = append(s.behaviors, r)
	}
	s.markEmpty(claimGroup{main: true}, time.Now())

	// The other claimer's claim of the main group holds 8 of the 10 slots:
	// full may take the 2 left, as many as the node has free, and joins
	// the main group, which found nothing without it.
	other, ok, _ := s.reserve(claimGroup{main: true, limit: 8, behaviors: []store.BehaviorLease{{Behavior: "plain"}}})
	require.True(t, ok)
	groups := s.activeGroups(s.claimGroups(nil), false)
	require.Len(t, groups, 1, "the main group with full in it is asked")
	require.Equal(t, []api.BehaviorID{"full"}, groups[0].capped)
	require.NotEqual(t, "", groups[0].key(), "named apart from the main group without full")

	// A third claim takes the 2 slots left before this one reserves its
	// own: it waits for one of the claims in flight to return.
	third, ok, _ := s.reserve(claimGroup{main: true, limit: 2, behaviors: []store.BehaviorLease{{Behavior: "plain"}}})
	require.True(t, ok)
	_, ok, held := s.reserve(groups[0])
	require.False(t, ok)
	require.NotNil(t, held, "no room while claims are in flight")
	select {
	case <-held:
		t.Fatal("held is closed before a claim returned")
	default:
	}
	s.unreserve(other, nil, true, false)
	select {
	case <-held:
	default:
		t.Fatal("held is not closed when a claim returned")
	}
	s.unreserve(third, nil, true, false)
	g, ok, _ := s.reserve(groups[0])
	require.True(t, ok)
	require.Equal(t, 2, g.limit)
}

// TestAFreedCapSlotIsNotLostToAClaimInFlight checks the two ways the end
// of a run under a cap across nodes could leave the claimers idle while a
// claim of its behavior, sent before the slot freed, was in flight: the
// claimer woken for the slot skipped its claim (one claim under flow
// control per behavior at a time) and waited for nothing; and the claim
// in flight, which counted the slot taken and found nothing, marked the
// group empty after the wake-up had cleared the mark.
func TestAFreedCapSlotIsNotLostToAClaimInFlight(t *testing.T) {
	t.Parallel()
	reg := spi.NewRegistry()
	s := &Server{slots: newSlots(10), claimReturned: make(chan struct{}), cfg: ServerConfig{PollInterval: time.Hour, Registry: reg}}
	require.NoError(t, spi.Register(reg, noopBehavior{"capped", spi.Policy{GroupConcurrency: 2}}))
	r, _ := reg.Lookup("capped")
	s.behaviors = append(s.behaviors, r)

	groups := s.claimGroups(nil)
	require.Len(t, groups, 1)
	groups[0].limit = 3
	inFlight, ok, _ := s.reserve(groups[0])
	require.True(t, ok)

	// A run ends and frees a slot: the woken claimer finds the claim in
	// flight, and waits for it to return.
	s.mu.Lock()
	s.forgetEmpty("capped")
	s.mu.Unlock()
	_, ok, held := s.reserve(s.claimGroups(nil)[0])
	require.False(t, ok, "one claim under flow control per behavior at a time")
	require.NotNil(t, held, "the skipped claim waits for the one in flight")

	s.unreserve(inFlight, nil, true, false)
	select {
	case <-held:
	default:
		t.Fatal("held is not closed when the claim in flight returned")
	}
	require.Len(t, s.activeGroups(s.claimGroups(nil), false), 1,
		"a claim that found nothing before the slot freed leaves the group to be asked")

	// A claim sent after the slot freed that finds nothing marks it.
	g, ok, _ := s.reserve(s.claimGroups(nil)[0])
	require.True(t, ok)
	s.unreserve(g, nil, true, false)
	require.Empty(t, s.activeGroups(s.claimGroups(nil), false))
}

// TestAProcessIgnoresItsOwnKicks checks that a hub does not dispatch the
// due notifications of its own process's kicker, whose kicks woke the
// local claimers themselves, and dispatches every other.
func TestAProcessIgnoresItsOwnKicks(t *testing.T) {
	t.Parallel()
	k := newKicker(nil, nil)
	h := newHub(nil, nil, func(error) {})
	h.self = k.token
	woken := 0
	h.setOnDue(func() { woken++ })
	for _, c := range []struct {
		payload string
		wakes   bool
	}{
		{k.token, false},
		{"", true},                        // a submit statement's
		{newKicker(nil, nil).token, true}, // another process's kick
	} {
		before := woken
		h.dispatch(store.ChannelDue, c.payload)
		require.Equal(t, c.wakes, woken > before, "payload %q", c.payload)
	}
}
