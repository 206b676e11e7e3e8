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

// TestAClaimLeavesRoomForLocalStarts: while the node's own submits start
// tasks on it, a claim that expects no backlog reserves half of the free
// slots, so that a submit made while it is in the database starts its task
// at once, without waiting for it; a claim that found a backlog, or one on
// a node whose submits started nothing lately, asks for every free slot.
func TestAClaimLeavesRoomForLocalStarts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name         string
		local        bool // a local start was asked for lately
		backlog      bool // the last claim found as many tasks as it asked for
		claimReserve int
	}{
		{name: "local starts, no backlog", local: true, claimReserve: 5},
		{name: "local starts, a backlog", local: true, backlog: true, claimReserve: 10},
		{name: "no local starts", claimReserve: 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := &Server{started: true, slots: newSlots(10), claimReturned: make(chan struct{}), startWait: time.Hour,
				cfg:       ServerConfig{PollInterval: time.Hour},
				behaviors: []*spi.Registration{{ID: "b", Policy: spi.Policy{Lease: time.Minute}}},
				backlog:   map[string]bool{"": c.backlog}}
			if c.local {
				s.localAt = time.Now()
			}
			groups := s.claimGroups(nil)
			require.Len(t, groups, 1)
			g, ok, _ := s.reserve(groups[0])
			require.True(t, ok)
			require.Equal(t, c.claimReserve, g.limit, "slots the claim holds")
			if c.claimReserve == 10 && !c.backlog {
				// Every slot held and no backlog: a submit would wait
				// for the claim (TestLocalStartWaitsForAClaimWithoutBacklog).
				s.unreserve(g, nil, true, false)
				require.Equal(t, 10, s.slots.free())
				return
			}
			tasks := []store.NewTask{{Behavior: "b"}}
			started := s.reserveStarts(context.Background(), tasks)
			require.Equal(t, c.claimReserve < 10, started, "the submit starts its task while the claim is in flight")
			s.mu.Lock()
			require.Zero(t, s.startWaiting)
			s.mu.Unlock()
			s.unreserve(g, nil, true, false)
			if started {
				s.submitStarted(tasks, nil, time.Now())
			}
			require.Equal(t, 10, s.slots.free(), "every slot is free again")
		})
	}
}

// TestLocalStartWaitsForAClaimWithoutBacklog checks how a server's own
// submit finds a slot while a claim statement holds every free one: when
// the last claim found no backlog it waits for the claim to return and
// takes a slot it gave back; with a backlog, when its context ends or
// when the server stops meanwhile, it leaves the task to the claimers.
func TestLocalStartWaitsForAClaimWithoutBacklog(t *testing.T) {
	t.Parallel()
	// setup returns a started server of 2 slots with a claim in flight
	// that holds both, and the claim's group.
	setup := func(idle bool) (*Server, claimGroup) {
		s := &Server{started: true, slots: newSlots(2), claimReturned: make(chan struct{}), startWait: time.Hour,
			behaviors: []*spi.Registration{{ID: "b", Policy: spi.Policy{Lease: time.Minute}}}}
		s.backlog = map[string]bool{"": !idle}
		groups := s.claimGroups(nil)
		require.Len(t, groups, 1)
		g, ok, _ := s.reserve(groups[0])
		require.True(t, ok)
		require.Equal(t, 2, g.limit)
		return s, g
	}
	submit := func(s *Server, ctx context.Context) <-chan []store.NewTask {
		out := make(chan []store.NewTask, 1)
		go func() {
			tasks := []store.NewTask{{Behavior: "b"}, {Behavior: "b"}}
			s.reserveStarts(ctx, tasks)
			out <- tasks
		}()
		return out
	}
	waiting := func(s *Server) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.startWaiting > 0
	}

	s, g := setup(true)
	s.slots.max = 3 // one slot free for the first task
	done := submit(s, context.Background())
	require.Eventually(t, func() bool { return waiting(s) }, time.Minute, time.Millisecond)
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.unreserve(g, nil, true, false)
	tasks := <-done
	require.Zero(t, tasks[0].StartLease, "the server stopped while the submit waited: nothing starts")
	require.Zero(t, tasks[1].StartLease)
	require.Equal(t, 3, s.slots.free(), "and the slot the first task had is free again")

	s, g = setup(true)
	done = submit(s, context.Background())
	require.Eventually(t, func() bool { return waiting(s) }, time.Minute, time.Millisecond, "no backlog: the submit waits for the claim")
	s.unreserve(g, make([]store.Claimed, 1), true, false)
	tasks = <-done
	require.Equal(t, time.Minute, tasks[0].StartLease, "it starts in the slot the claim gave back")
	require.Zero(t, tasks[1].StartLease, "the claim filled the other slot, and the submit waits once")
	require.Zero(t, s.slots.free())

	s, _ = setup(false)
	tasks = <-submit(s, context.Background())
	require.Zero(t, tasks[0].StartLease, "a backlog: the submit leaves its tasks to the claimers at once")
	require.Zero(t, tasks[1].StartLease)

	s, _ = setup(true)
	ctx, cancel := context.WithCancel(context.Background())
	done = submit(s, ctx)
	require.Eventually(t, func() bool { return waiting(s) }, time.Minute, time.Millisecond)
	cancel()
	tasks = <-done
	require.Zero(t, tasks[0].StartLease, "the submit's context ended: no slot")
	require.Zero(t, tasks[1].StartLease)
	require.False(t, waiting(s))
}

// TestASubmitOfManyLeavesTheClaimersTheirShare: a server's own submit of
// more tasks than the node has slots starts at most half of the free
// ones here, rounded up, and never waits for a claim; a submit made while
// the last claim of a main claim group came back full starts none, and
// reserves nothing.
func TestASubmitOfManyLeavesTheClaimersTheirShare(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		tasks   int
		held    int // slots a claim in flight holds
		backlog map[string]bool
		started int
	}{
		{name: "few tasks take every free slot", tasks: 6, held: 4, started: 6},
		{name: "more tasks than slots take half the free ones", tasks: 11, held: 3, started: 4},
		{name: "more tasks than slots, none free: no wait", tasks: 11, held: 10},
		{name: "a backlog in the main group", tasks: 1, backlog: map[string]bool{"": true}},
		{name: "a backlog in a main group with a capped behavior", tasks: 1, backlog: map[string]bool{"\x00c": true}},
		{name: "a backlog of a behavior of its own", tasks: 1, backlog: map[string]bool{"other": true}, started: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := &Server{started: true, slots: newSlots(10), claimReturned: make(chan struct{}), startWait: time.Hour,
				behaviors: []*spi.Registration{{ID: "b", Policy: spi.Policy{Lease: time.Minute}}}, backlog: c.backlog}
			s.slots.reserve(c.held, nil, nil)
			s.claiming = 1 // a submit that waited for it would wait an hour
			tasks := make([]store.NewTask, c.tasks)
			for i := range tasks {
				tasks[i].Behavior = "b"
			}
			s.reserveStarts(context.Background(), tasks)
			n := 0
			for _, task := range tasks {
				if task.StartLease > 0 {
					n++
				}
			}
			require.Equal(t, c.started, n, "tasks marked to start here")
			require.Equal(t, 10-c.held-c.started, s.slots.free(), "slots reserved for them, no more")
		})
	}
}

// TestAFinishOffersHalfTheFreeSlotsToTheNodesItWakes: a batch of ends
// that ends a workflow node offers its statement half of the free slots,
// rounded up, for the behaviors that cap nothing, reserved when the store
// asks; the slots it does not fill are free again after it (and the
// claimers are told); a batch that ends no node offers none, and a
// stopped server reserves none.
func TestAFinishOffersHalfTheFreeSlotsToTheNodesItWakes(t *testing.T) {
	t.Parallel()
	node := &run{claimed: store.Claimed{LeaseRef: store.LeaseRef{ID: "wf/a"}, ParentID: "wf"},
		end: store.Completion{Status: api.StatusSuccess}}
	child := &run{claimed: store.Claimed{LeaseRef: store.LeaseRef{ID: "wfa"}, ParentID: "wf"},
		end: store.Completion{Status: api.StatusSuccess}}
	retried := &run{claimed: store.Claimed{LeaseRef: store.LeaseRef{ID: "wf/b"}, ParentID: "wf"},
		end: store.Completion{Status: api.StatusFailure, Again: true}}
	for _, c := range []struct {
		name     string
		batch    []*run
		stopped  bool
		offered  bool
		reserved int
	}{
		{name: "a node ended", batch: []*run{child, node}, offered: true, reserved: 4},
		{name: "a child that is not a node", batch: []*run{child}},
		{name: "a node to run again", batch: []*run{retried}},
		{name: "stopped", batch: []*run{node}, stopped: true, offered: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := &Server{started: true, stopped: c.stopped, slots: newSlots(10), slotFreed: make(chan struct{}, 1),
				cfg:          ServerConfig{Node: "n1"},
				nodeStarters: []store.BehaviorLease{{Behavior: "b", Lease: time.Minute}}}
			s.slots.reserve(3, nil, nil) // 7 free
			start, end := s.offerNodeStarts(c.batch)
			if !c.offered {
				require.Nil(t, start.Reserve)
				return
			}
			require.Equal(t, "n1", start.Node)
			require.Equal(t, 7, s.slots.free(), "slots are reserved only when the store asks")
			require.Equal(t, c.reserved, start.Reserve())
			require.Equal(t, 7-c.reserved, s.slots.free(), "the offer holds its slots while the statement is out")
			// The runs of started nodes begin as claimed ones do
			// (TestAFinishStartsTheNodesItMakesReadyHere); here none did.
			end(nil, time.Now())
			require.Equal(t, 7, s.slots.free(), "the slots the statement did not fill are free again")
			if c.reserved == 0 {
				return
			}
			select {
			case <-s.slotFreed:
			default:
				t.Fatal("slots given back signal the claimers")
			}
		})
	}
}
