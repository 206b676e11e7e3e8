package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stinthq/stint/internal/faultpoint"
	"github.com/stinthq/stint/store"
)

// A claim under flow control whose limits do not bind takes tasks as a
// plain claim does, in one statement, and checks them after: the claim of
// a behavior with a cluster cap far from binding and rate limits with
// budget to spare, the common case, costs little more than a plain one.
//
// It is tried first when the behavior has no caps per group key by its
// policy, no fair share, and none of its claims held a task back in the
// last flowTightFor; caps per key set at runtime, found once the behavior
// is locked, send it to the careful claim too. Its limit is within the
// cluster cap as a careful claim's is (see configure). After the claim
// statement it locks the
// rate keys its tasks spend, in order and waiting, as the careful claim
// locks those of its first window, and spends their units in pickup
// order. Should a key not admit a task, the transaction is rolled back,
// as if it had never been, and the careful claim (ClaimFlow) runs.

// flowTightFor is how long a behavior whose claim held a task back, or
// found a rate key that did not admit one, is claimed carefully only.
const flowTightFor = time.Second

// errFlowBinds reports that a limit binds a claim tried at once.
var errFlowBinds = errors.New("a flow limit binds the claim")

// flowTakeSQL claims as claimSQL does, for a claim that counted what it
// claims, returning the tasks' rate uses; flowTakeGuardedSQL does so only
// when, in the same statement, no cap per key is set at runtime and the
// cluster cap in force (stored at runtime, else the policy's $7; 0: none)
// leaves room for the whole claim by the bound of leaseBoundSQL: it goes
// out in the batch that takes the behavior's turn and reads the caps, and
// claims when the caps it reads would let it.
var (
	flowTakeSQL        = claimCTEs(walkHints(skipLocked), true, "")
	flowTakeGuardedSQL = claimCTEs(walkHints(skipLocked), true, `
      AND NOT EXISTS (SELECT 1 FROM stint_concurrency cc WHERE cc.behavior = w.behavior AND cc.key <> '' AND cc.max > 0)
      AND (SELECT g.cap <= 0 OR g.bound + $4 <= g.cap FROM (SELECT
              coalesce((SELECT cc.max FROM stint_concurrency cc WHERE cc.behavior = w.behavior AND cc.key = ''), $7::int) AS cap,
              (SELECT `+leaseBound("l")+` FROM stint_lease l WHERE l.behavior = w.behavior) AS bound) g)`)
)

// leaseBoundSQL returns an upper bound on the running tasks of the
// behavior $1: the tasks its lease rows name whose finish was not
// recorded (see leasesEnded; tasks that stopped running otherwise, taken
// over or cancelled, count until the row is dropped). One row per claim
// statement, not per task.
var leaseBoundSQL = `SELECT ` + leaseBound("l") + `::bigint FROM stint_lease l WHERE l.behavior = $1`

// leaseBound sums the tasks the lease rows l name. It reads the count
// stored beside each row's array, not the array: a claim's array of a
// thousand ids is stored compressed and out of line, and reading it back
// cost more than the rest of the bound. A row written by a node that
// predates the count has none; its array is counted.
func leaseBound(l string) string {
	return `coalesce(sum(coalesce(` + l + `.task_count, cardinality(` + l + `.task_ids))), 0)`
}

// flowLoose reports whether a claim of req may be tried at once.
func (s *Store) flowLoose(req store.ClaimRequest) bool {
	if req.PerGroup > 0 || req.FairShare {
		return false
	}
	at, ok := s.flowTight.Load(string(req.Behaviors[0].Behavior))
	return !ok || time.Since(at.(time.Time)) >= flowTightFor
}

// takeFlow is the claim tried at once; see flowLoose. It returns
// errFlowBinds, having changed nothing, when a limit binds. Its
// transaction opens in the batch of its first statements and commits in
// the batch of its last: three round trips where no exact count is needed.
func (s *Store) takeFlow(ctx context.Context, req store.ClaimRequest) ([]store.Claimed, store.FlowHeld, error) {
	behaviors := []string{string(req.Behaviors[0].Behavior)}
	leases := []int64{req.Behaviors[0].Lease.Microseconds()}
	var out []store.Claimed
	var held store.FlowHeld
	err := s.connTx(ctx, func(c *pgx.Conn) (err error) {
		out, err = s.takeFlowOn(ctx, c, req, behaviors, leases, &held)
		return err
	})
	if errors.Is(err, errFlowBinds) {
		s.flowTight.Store(behaviors[0], time.Now())
		return nil, store.FlowHeld{}, err
	}
	if err != nil {
		return nil, store.FlowHeld{}, fmt.Errorf("claim tasks: %w", err)
	}
	return out, held, nil
}

// takeFlowOn is takeFlow on conn: it opens the transaction and, unless it
// fails, commits it. The first round trip takes the behavior's turn,
// reads the caps, locks and reads the rate keys the behavior's last claim
// spent (most often those this one spends) and claims, guarded; the last
// stores the rate keys and commits. In between, only what the first could
// not know: the running tasks counted exactly when the bound did not
// leave room (and a claim within what the count leaves), and rate keys
// not locked yet. It sets held's LeaseDelay.
func (s *Store) takeFlowOn(ctx context.Context, conn *pgx.Conn, req store.ClaimRequest, behaviors []string, leases []int64, held *store.FlowHeld) ([]store.Claimed, error) {
	f := newFlowClaim(conn, req)
	var predicted []rateRef
	if p, ok := s.flowRates.Load(behaviors[0]); ok {
		predicted = p.([]rateRef)
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	f.queueConfigure(b, !req.Busy)
	q := f.queueRates(b, predicted, true)
	b.Queue(flowTakeGuardedSQL, req.Node, behaviors, leases, req.Limit, req.LookAhead.Microseconds(), claimLeases(req), req.Cluster)
	var out []store.Claimed
	var uses []taskUses
	err := func() error {
		br := conn.SendBatch(ctx, b)
		defer br.Close()
		if _, err := br.Exec(); err != nil {
			return err
		}
		if err := f.readConfigure(br); err != nil {
			return err
		}
		if err := f.readRates(br, q); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		if out, err = s.scanClaimed(rows, req.Limit, behaviors, &uses); err != nil {
			return err
		}
		return br.Close()
	}()
	if err != nil {
		return nil, err
	}
	held.LeaseDelay = f.leaseDelay()
	if !f.idle {
		faultpoint.Reach(faultpoint.FlowClaim)
	}
	if f.idle && len(out) > 0 {
		// No hint was due when the turn was to be taken, so it was not;
		// the claim found hints that became visible since, and without
		// the turn another claimer's uncommitted runs escape its caps.
		// Undone: the careful claim takes the turn first.
		return nil, errFlowBinds
	}
	if len(out) == 0 && !f.idle {
		// The guard held the claim back (or nothing was due): claim what
		// the exact count leaves, if the caps per key do not bind.
		if len(f.keyMax) > 0 {
			return nil, errFlowBinds
		}
		if f.needsCount() {
			if err := f.count(ctx); err != nil {
				return nil, err
			}
			if f.limit > 0 {
				rows, err := conn.Query(ctx, flowTakeSQL, req.Node, behaviors, leases, f.limit, req.LookAhead.Microseconds(), claimLeases(req))
				if err != nil {
					return nil, err
				}
				if out, err = s.scanClaimed(rows, f.limit, behaviors, &uses); err != nil {
					return nil, err
				}
			}
		}
	}
	f.heldByCaps(held, len(out))
	spent, err := f.spendAll(ctx, out, uses, len(predicted) == 0)
	if err != nil {
		return nil, err
	}
	b = &pgx.Batch{}
	f.queueWrite(b)
	f.queueClearWaiting(b, out)
	b.Queue("COMMIT")
	if err := sendAll(ctx, conn, b); err != nil {
		return nil, err
	}
	if len(out) > 0 {
		if len(spent) <= maxPredictedRates {
			s.flowRates.Store(behaviors[0], spent)
		} else {
			s.flowRates.Delete(behaviors[0])
		}
	}
	return out, nil
}

// maxPredictedRates bounds the rate keys a behavior's next claim locks
// before it knows its tasks: a behavior whose claims spend many keys (a
// key per customer, say) locks them once it knows them.
const maxPredictedRates = 8

// spendAll locks the rate keys the claimed tasks use that are not locked
// yet (waiting when wait is set, else only trying: keys locked before
// were taken first, out of order) and spends their units; errFlowBinds
// when a key does not admit them all, or is held by another claimer. A
// key's units are spent at once: if it admits their sum, it admits each
// task in pickup order, the budget only growing smaller. It returns the
// keys spent.
func (f *flowClaim) spendAll(ctx context.Context, claimed []store.Claimed, uses []taskUses, wait bool) ([]rateRef, error) {
	var refs, missing []rateRef
	sum := map[rateRef]int64{}
	for i, u := range uses {
		for _, r := range u.uses {
			ref := rateRef{r.Limit, r.Key}
			if _, ok := sum[ref]; !ok {
				refs = append(refs, ref)
				if !f.readRefs[ref] {
					missing = append(missing, ref)
				}
			}
			sum[ref] += r.Units
		}
		if u.waiting {
			f.waiting = append(f.waiting, claimed[i].ID)
		}
	}
	if err := f.lockRates(ctx, missing, wait); err != nil {
		return nil, err
	}
	for _, ref := range refs {
		if _, ok := f.limits[ref.limit]; !ok {
			continue // the limit is gone: the use is free
		}
		k := f.rates[ref]
		if k == nil || !k.admits(sum[ref]) {
			return nil, errFlowBinds
		}
		k.spend(sum[ref])
	}
	return refs, nil
}

// taskUses is a claimed task's rate uses, and whether it waited on a rate
// limit.
type taskUses struct {
	uses    []store.RateUse
	waiting bool
}

// usesDecoder decodes the rate uses of claimed tasks, in the order of the
// claim's rows (see claimCTEs), remembering the last few encodings: the
// tasks of a claim mostly spend the same uses.
type usesDecoder struct {
	known map[string][]store.RateUse
	prev  []store.RateUse // the uses of the row before
}

// decode decodes the rate uses (jsonb) and waiting (bool) columns of a
// counted claim's row.
func (d *usesDecoder) decode(v [][]byte, fields []pgconn.FieldDescription) (taskUses, error) {
	var u taskUses
	if len(v) != 2 || len(fields) != 2 {
		return u, errors.New("a claimed row lacks its rate uses")
	}
	raw, err := jsonbText(v[0], fields[0].Format == pgtype.BinaryFormatCode)
	if err != nil {
		return u, err
	}
	if u.uses, err = d.uses(raw); err != nil {
		return u, err
	}
	d.prev = u.uses
	switch {
	case v[1] == nil:
	case fields[1].Format == pgtype.BinaryFormatCode:
		u.waiting = len(v[1]) == 1 && v[1][0] != 0
	default:
		u.waiting = string(v[1]) == "t"
	}
	return u, nil
}

// uses decodes rate uses from their JSON text: nil for JSON null (none),
// the row before's for no text (SQL NULL: the same uses).
func (d *usesDecoder) uses(raw []byte) ([]store.RateUse, error) {
	switch {
	case raw == nil:
		return d.prev, nil
	case string(raw) == "null":
		return nil, nil
	}
	if u, ok := d.known[string(raw)]; ok {
		return u, nil
	}
	var u []store.RateUse
	if err := json.Unmarshal(raw, &u); err != nil {
		return nil, fmt.Errorf("rate uses: %w", err)
	}
	if d.known == nil || len(d.known) >= 64 {
		d.known = map[string][]store.RateUse{}
	}
	d.known[string(raw)] = u
	return u, nil
}
