package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// reparkSQL parks the claim hints of the behavior $1 or the group key $2
// whose behavior is paused or whose key is held, and unparks the others.
// Parked hints are out of the claim index (stint_due_order covers only the
// others), so that a claim never walks past them. It locks the hints in
// ctid order, the order in which a claim deletes the hints it took (see
// claimSQL), so that the two never wait on each other in a cycle.
const reparkSQL = `
UPDATE stint_due d SET parked = NOT d.parked
WHERE d.ctid = ANY(ARRAY(
    SELECT c.ctid FROM stint_due c
    WHERE (c.behavior = $1 OR c.group_key = $2)
      AND c.parked <> (EXISTS (SELECT 1 FROM stint_behavior b WHERE b.behavior = c.behavior AND b.paused)
          OR EXISTS (SELECT 1 FROM stint_hold h WHERE h.group_key = c.group_key))
    ORDER BY c.ctid
    FOR UPDATE))`

// parkLock is the transaction-scoped advisory lock that serializes the
// changes of pauses and holds with their reparking, so that each repark
// sees the pauses and holds of those before it.
const parkLock = `SELECT pg_advisory_xact_lock(hashtextextended('stint.park', 0))`

// changeParking runs change (a statement that pauses, resumes, holds or
// releases) and then reparks the hints of behavior or key, in one
// transaction under parkLock (and holdIdleTimeout).
//
// The repark is a statement of its own, after change: a statement that adds
// a hint parked share-locks the pause or hold row it found, so that change
// waits for that statement's transaction to commit, and the repark, which
// reads a snapshot taken after change, sees the hint and unparks it.
func (s *Store) changeParking(ctx context.Context, behavior string, key *string, change func(tx pgx.Tx) error) error {
	return holdingTx(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, parkLock); err != nil {
			return err
		}
		if err := change(tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, reparkSQL, behavior, key)
		return err
	})
}
