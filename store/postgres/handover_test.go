package postgres_test

import (
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// handOverLease draws a lease for a hand-over claim, as a node does.
func handOverLease() [][16]byte {
	var l [16]byte
	_, _ = rand.Read(l[:])
	l[6], l[8] = l[6]&0x0f|0x40, l[8]&0x3f|0x80
	return [][16]byte{l}
}

// A finish hands the slots of the runs it ends over to the next due tasks
// of their behavior, in its transaction: a plain claim (a cap per node)
// takes up to its limit in pickup order, under its drawn lease; a claim
// under flow control counts the running tasks after the finish and takes
// only what the caps admit (here one group key at its cap of 1 while the
// other's run ended). HandedOver hears of each once the finish committed.
func TestFinishHandsSlotsOver(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	for i := range 4 {
		submitT(t, ctx, st, store.NewTask{ID: api.TaskID(fmt.Sprintf("plain-%d", i)), Behavior: "sem.plain", Priority: i + 1})
	}
	for i, key := range []string{"a", "b", "a", "a"} {
		submitT(t, ctx, st, store.NewTask{ID: api.TaskID(fmt.Sprintf("keyed-%d", i)), Behavior: "sem.keyed", GroupKey: key})
	}
	plain := store.BehaviorLease{Behavior: "sem.plain", Lease: time.Minute}
	keyed := store.BehaviorLease{Behavior: "sem.keyed", Lease: time.Minute}
	first, err := st.Claim(ctx, store.ClaimRequest{Node: "n1", Behaviors: []store.BehaviorLease{plain}, Limit: 1})
	require.NoError(t, err)
	require.Len(t, first, 1)
	flowReq := store.ClaimRequest{Node: "n1", Behaviors: []store.BehaviorLease{keyed}, Limit: 10, PerGroup: 1, Flow: true}
	running, _, err := st.ClaimFlow(ctx, flowReq)
	require.NoError(t, err)
	require.Len(t, running, 2, "one task of each key")
	var endA store.Claimed
	for _, c := range running {
		if c.GroupKey == "a" {
			endA = c
		}
	}

	reqs := []store.ClaimRequest{
		{Node: "n1", Behaviors: []store.BehaviorLease{plain}, Limit: 2, Leases: handOverLease()},
		{Node: "n1", Behaviors: []store.BehaviorLease{keyed}, Limit: 2, PerGroup: 1, Flow: true, Leases: handOverLease()},
	}
	handed := map[int][]store.Claimed{}
	held, started, err := st.FinishStart(ctx, []store.Completion{
		{LeaseRef: first[0].LeaseRef, Status: api.StatusSuccess, Result: []byte(`{}`)},
		{LeaseRef: endA.LeaseRef, Status: api.StatusSuccess, Result: []byte(`{}`)},
	}, store.LocalStart{Node: "n1", HandOver: reqs, HandedOver: func(i int, claimed []store.Claimed, _ store.FlowHeld) {
		handed[i] = claimed
	}})
	require.NoError(t, err)
	require.Equal(t, []bool{true, true}, held)
	require.Empty(t, started, "no workflow node started")
	require.Len(t, handed, 2)
	require.Len(t, handed[0], 2, "the plain claim's limit")
	require.Equal(t, []api.TaskID{"plain-1", "plain-2"}, []api.TaskID{handed[0][0].ID, handed[0][1].ID}, "in pickup order")
	require.Len(t, handed[1], 1, "key b is at its cap; key a's slot is free again")
	require.Equal(t, "a", handed[1][0].GroupKey)
	for i, claimed := range handed {
		for _, c := range claimed {
			require.Equal(t, reqs[i].Leases[0], c.Lease, "the drawn lease")
			var status, node string
			require.NoError(t, st.Pool().QueryRow(ctx, `SELECT status, node FROM stint_task WHERE id = $1 AND lease = $2`,
				string(c.ID), c.Lease[:]).Scan(&status, &node))
			require.Equal(t, []string{"running", "n1"}, []string{status, node})
		}
	}
	var finished int
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT count(*) FROM stint_task WHERE status = 'success'`).Scan(&finished))
	require.Equal(t, 2, finished)

	// A batch with a child's completion hands nothing over: HandedOver is
	// not called, and the tasks stay due.
	submitT(t, ctx, st, store.NewTask{ID: "parent", Behavior: "sem.parent"})
	parent, err := st.Claim(ctx, store.ClaimRequest{Node: "n1", Behaviors: []store.BehaviorLease{{Behavior: "sem.parent", Lease: time.Minute}}, Limit: 1})
	require.NoError(t, err)
	require.Len(t, parent, 1)
	calls := 0
	_, _, err = st.FinishStart(ctx, []store.Completion{{LeaseRef: handed[0][0].LeaseRef, Status: api.StatusSuccess, Result: []byte(`{}`), HasParent: true}},
		store.LocalStart{Node: "n1", HandOver: reqs[:1], HandedOver: func(int, []store.Claimed, store.FlowHeld) { calls++ }})
	require.NoError(t, err)
	require.Zero(t, calls)
	var due int
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT count(*) FROM stint_task WHERE behavior = 'sem.plain' AND status = 'scheduled'`).Scan(&due))
	require.Equal(t, 1, due)
}
