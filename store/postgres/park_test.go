package postgres_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// parked counts the claim hints of the tasks ids that are parked and those
// that are not.
func parked(t *testing.T, ctx context.Context, st *postgres.Store, ids ...string) (in, out int) {
	t.Helper()
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT count(*) FILTER (WHERE parked), count(*) FILTER (WHERE NOT parked)
		FROM stint_due WHERE id = ANY($1)`, ids).Scan(&in, &out))
	return in, out
}

func pause(t *testing.T, ctx context.Context, st *postgres.Store, paused bool) {
	t.Helper()
	require.NoError(t, st.SetBehavior(ctx, store.BehaviorSettings{Behavior: semBehavior, Paused: paused}))
}

// The hints of a paused behavior and of a held group key leave the claim
// index, whether they were there before the pause or hold or added during
// it; resuming and releasing bring back those nothing else keeps parked.
func TestParkedHints(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "before"}, store.NewTask{ID: "grouped", GroupKey: "g"})
	pause(t, ctx, st, true)
	require.NoError(t, st.HoldGroup(ctx, "g"))
	submitT(t, ctx, st, store.NewTask{ID: "during"}, store.NewTask{ID: "grouped-during", GroupKey: "g"})
	in, out := parked(t, ctx, st, "before", "grouped", "during", "grouped-during")
	require.Equal(t, [2]int{4, 0}, [2]int{in, out}, "every hint parked")
	require.Empty(t, claimT(t, ctx, st, 10, 0))

	pause(t, ctx, st, false)
	in, out = parked(t, ctx, st, "before", "during")
	require.Equal(t, [2]int{0, 2}, [2]int{in, out}, "the resumed behavior's hints are back")
	in, out = parked(t, ctx, st, "grouped", "grouped-during")
	require.Equal(t, [2]int{2, 0}, [2]int{in, out}, "the held group's hints stay parked")
	require.ElementsMatch(t, []string{"before", "during"}, claimedIDs(claimT(t, ctx, st, 10, 0)))

	pause(t, ctx, st, true)
	require.NoError(t, st.ReleaseGroup(ctx, "g"))
	in, out = parked(t, ctx, st, "grouped", "grouped-during")
	require.Equal(t, [2]int{2, 0}, [2]int{in, out}, "released, the hints of a paused behavior stay parked")
	pause(t, ctx, st, false)
	require.ElementsMatch(t, []string{"grouped", "grouped-during"}, claimedIDs(claimT(t, ctx, st, 10, 0)))
}

// One statement that adds hints for a held key and for tasks without a key
// parks the first and leaves the others in the claim index.
func TestParkedHintsBesideUnkeyedOnes(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	require.NoError(t, st.HoldGroup(ctx, "g"))
	submitT(t, ctx, st, store.NewTask{ID: "free"}, store.NewTask{ID: "grouped", GroupKey: "g"}, store.NewTask{ID: "other", GroupKey: "h"})
	in, out := parked(t, ctx, st, "grouped")
	require.Equal(t, [2]int{1, 0}, [2]int{in, out}, "the held key's hint is parked")
	in, out = parked(t, ctx, st, "free", "other")
	require.Equal(t, [2]int{0, 2}, [2]int{in, out}, "the others are not")
	require.ElementsMatch(t, []string{"free", "other"}, claimedIDs(claimT(t, ctx, st, 10, 0)))
}

// A hint added parked by a transaction that commits after a resume or
// release started is unparked by it: the resume waits for the transaction.
func TestParkedHintOfConcurrentSubmit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name          string
		park, release func(context.Context, *postgres.Store) error
		task          store.NewTask
	}{
		{"resume",
			func(ctx context.Context, st *postgres.Store) error {
				return st.SetBehavior(ctx, store.BehaviorSettings{Behavior: semBehavior, Paused: true})
			},
			func(ctx context.Context, st *postgres.Store) error {
				return st.SetBehavior(ctx, store.BehaviorSettings{Behavior: semBehavior})
			},
			store.NewTask{ID: "concurrent", Behavior: semBehavior, Priority: 5}},
		{"release",
			func(ctx context.Context, st *postgres.Store) error { return st.HoldGroup(ctx, "g") },
			func(ctx context.Context, st *postgres.Store) error { return st.ReleaseGroup(ctx, "g") },
			store.NewTask{ID: "concurrent", Behavior: semBehavior, Priority: 5, GroupKey: "g"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, st := openT(t)
			require.NoError(t, c.park(ctx, st))
			tx, err := st.Pool().Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = st.SubmitTx(ctx, tx, []store.NewTask{c.task})
			require.NoError(t, err)
			var inTx bool
			require.NoError(t, tx.QueryRow(ctx, `SELECT parked FROM stint_due WHERE id = 'concurrent'`).Scan(&inTx))
			require.True(t, inTx, "added parked")

			released := make(chan error, 1)
			go func() { released <- c.release(ctx, st) }()
			waitForLockWaiter(t, ctx, st, released)
			require.NoError(t, tx.Commit(ctx))
			require.NoError(t, <-released)
			cl := claimT(t, ctx, st, 10, 0)
			require.Len(t, cl, 1, "the hint added during the release was unparked")
		})
	}
}

// waitForLockWaiter waits until a session of the database waits for a
// lock, on a condition and not a clock; it fails if done delivers first.
func waitForLockWaiter(t *testing.T, ctx context.Context, st *postgres.Store, done <-chan error) {
	t.Helper()
	for {
		select {
		case err := <-done:
			t.Fatalf("the change did not wait for the open transaction's lock (err %v)", err)
		default:
		}
		var n int
		err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		require.NoError(t, err)
		if n > 0 {
			return
		}
		_, err = st.Pool().Exec(ctx, `SELECT pg_sleep(0.01)`)
		require.NoError(t, err)
	}
}

func claimedIDs(cl []store.Claimed) []string {
	ids := make([]string, len(cl))
	for i, c := range cl {
		ids[i] = string(c.ID)
	}
	return ids
}
