package postgres

// The hand-over: a finish that ends runs at a cap of their node claims,
// in its own transaction, the next tasks for the slots they free.

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stinthq/stint/store"
)

// handOverSettingsSQL sets, for the claims a finish makes after its own
// statement (see finishHandOver), what claimSettingsSQL sets for a claim,
// but synchronous_commit: the transaction records the finish, so its
// commit waits for its WAL flush as the finish's alone does.
const handOverSettingsSQL = `SELECT set_config('enable_seqscan', 'off', true),
    set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true),
    set_config('jit', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)`

// finishHandOver records a batch of completions (finishSQL's args, of n
// completions, none of a child nor one that sleeps on a signal) and makes
// the claims of st.HandOver (see store.LocalStart) in the same
// transaction, after the finish statement: the tasks it ended no longer
// count as running, so the claims take the slots they freed. A plain
// claim (a behavior capped on its node only) is claimSkipSQL in the finish's
// round trip, without the claim's turn (see claimTurnSQL), which would be
// held through the commit's WAL flush; a claim under flow control is
// ClaimFlow's careful claim, its round trips after the finish's, within
// the transaction (it takes its behavior's turn, reads the caps and
// counts the running tasks as any claim under flow control does). Once
// the transaction committed, st.HandedOver hears what each claim took. It
// returns the completions not recorded.
func (s *Store) finishHandOver(ctx context.Context, settings string, args []any, n int, st *starts) ([]int64, error) {
	st.handed = true
	reqs := st.HandOver
	claimed := make([][]store.Claimed, len(reqs))
	held := make([]store.FlowHeld, len(reqs))
	var lost []int64
	err := s.connTx(ctx, func(c *pgx.Conn) error {
		var parents []string
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(settings)
		b.Queue(finishSQL, args...).QueryRow(func(r pgx.Row) error {
			var nodes []string
			var hasDependents []bool
			return r.Scan(&lost, &parents, &nodes, &hasDependents)
		})
		flow, set := false, false
		for i, req := range reqs {
			if err := checkLeases(req); err != nil {
				return err
			}
			if req.Limited() {
				flow = true
				continue
			}
			if !set {
				b.Queue(handOverSettingsSQL)
				set = true
			}
			behaviors, leases := behaviorLeases(req.Behaviors)
			b.Queue(claimSkipSQL, req.Node, behaviors, leases, req.Limit, req.LookAhead.Microseconds(), claimLeases(req)).
				Query(func(rows pgx.Rows) error {
					var err error
					claimed[i], err = s.scanClaimed(rows, req.Limit, behaviors, nil)
					return err
				})
		}
		if !flow {
			b.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error { return committed(tag, nil) })
		}
		if err := c.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if len(parents) > 0 {
			return fmt.Errorf("tasks with parents were finished outside a transaction: set Completion.HasParent")
		}
		if err := checkLost(lost, n); err != nil {
			return err
		}
		if !flow {
			return nil
		}
		for i, req := range reqs {
			if !req.Limited() {
				continue
			}
			if len(req.Behaviors) != 1 {
				return fmt.Errorf("hand over: a claim under flow control must name one behavior, not %d", len(req.Behaviors))
			}
			f := newFlowClaim(c, req)
			f.nested = true
			var err error
			if claimed[i], held[i], err = s.claimFlowOn(ctx, f); err != nil {
				return fmt.Errorf("hand over %s: %w", f.behavior, err)
			}
			if len(f.moves) > 0 || len(f.tried) > 0 || len(f.capKeys) > 0 {
				s.flowTight.Store(f.behavior, time.Now())
			}
			f.heldByCaps(&held[i], len(claimed[i]))
		}
		return commitConn(ctx, c)
	})
	if err != nil {
		return nil, err
	}
	if st.HandedOver != nil {
		for i := range reqs {
			st.HandedOver(i, claimed[i], held[i])
		}
	}
	return lost, nil
}
