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
// claims, returning the tasks' rate uses.
var flowTakeSQL = claimCTEs(walkHints, true)

// leaseBoundSQL returns an upper bound on the running tasks of the
// behavior $1: the tasks its lease rows name, finished ones included
// until the row is dropped. One row per claim statement, not per task.
const leaseBoundSQL = `SELECT coalesce(sum(cardinality(task_ids)), 0)::bigint FROM stint_lease WHERE behavior = $1`

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
func (s *Store) takeFlow(ctx context.Context, req store.ClaimRequest) ([]store.Claimed, error) {
	behaviors := []string{string(req.Behaviors[0].Behavior)}
	leases := []int64{req.Behaviors[0].Lease.Microseconds()}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("claim tasks: %w", err)
	}
	// A connection left in the transaction (a failed round trip, a
	// cancelled context) is closed, not pooled, when released.
	defer conn.Release()
	out, err := s.takeFlowOn(ctx, conn.Conn(), req, behaviors, leases)
	if err != nil {
		if _, rbErr := conn.Exec(ctx, "ROLLBACK"); rbErr != nil {
			conn.Conn().Close(ctx)
		}
	}
	if errors.Is(err, errFlowBinds) {
		s.flowTight.Store(behaviors[0], time.Now())
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("claim tasks: %w", err)
	}
	return out, nil
}

// takeFlowOn is takeFlow on conn: it opens the transaction and, unless it
// fails, commits it.
func (s *Store) takeFlowOn(ctx context.Context, conn *pgx.Conn, req store.ClaimRequest, behaviors []string, leases []int64) ([]store.Claimed, error) {
	f := newFlowClaim(conn, req)
	f.begin = true
	if err := f.configure(ctx); err != nil {
		return nil, err
	}
	if f.limit > 0 && len(f.keyMax) > 0 {
		return nil, errFlowBinds
	}
	var out []store.Claimed
	if f.limit > 0 {
		rows, err := conn.Query(ctx, flowTakeSQL, req.Node, behaviors, leases, f.limit, req.LookAhead.Microseconds())
		if err != nil {
			return nil, err
		}
		var uses []taskUses
		if out, err = s.scanClaimed(rows, f.limit, behaviors, &uses); err != nil {
			return nil, err
		}
		if err := f.spendAll(ctx, out, uses); err != nil {
			return nil, err
		}
	}
	b := &pgx.Batch{}
	f.queueWrite(b)
	f.queueClearWaiting(b, out)
	b.Queue("COMMIT")
	if err := sendAll(ctx, conn, b); err != nil {
		return nil, err
	}
	return out, nil
}

// spendAll locks the rate keys the claimed tasks use, waiting, and spends
// their units; errFlowBinds when a key does not admit them all. A key's
// units are spent at once: if it admits their sum, it admits each task in
// pickup order, the budget only growing smaller.
func (f *flowClaim) spendAll(ctx context.Context, claimed []store.Claimed, uses []taskUses) error {
	var refs []rateRef
	sum := map[rateRef]int64{}
	for i, u := range uses {
		for _, r := range u.uses {
			ref := rateRef{r.Limit, r.Key}
			if _, ok := sum[ref]; !ok {
				refs = append(refs, ref)
			}
			sum[ref] += r.Units
		}
		if u.waiting {
			f.waiting = append(f.waiting, claimed[i].ID)
		}
	}
	if err := f.lockRates(ctx, refs, true); err != nil {
		return err
	}
	for _, ref := range refs {
		if _, ok := f.limits[ref.limit]; !ok {
			continue // the limit is gone: the use is free
		}
		k := f.rates[ref]
		if k == nil || !k.admits(sum[ref]) {
			return errFlowBinds
		}
		k.spend(sum[ref])
	}
	return nil
}

// taskUses is a claimed task's rate uses, and whether it waited on a rate
// limit.
type taskUses struct {
	uses    []store.RateUse
	waiting bool
}

// usesDecoder decodes the rate uses of claimed tasks, remembering the last
// few encodings: the tasks of a claim mostly spend the same uses.
type usesDecoder struct {
	known map[string][]store.RateUse
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
	switch {
	case v[1] == nil:
	case fields[1].Format == pgtype.BinaryFormatCode:
		u.waiting = len(v[1]) == 1 && v[1][0] != 0
	default:
		u.waiting = string(v[1]) == "t"
	}
	return u, nil
}

// uses decodes rate uses from their JSON text; nil for none.
func (d *usesDecoder) uses(raw []byte) ([]store.RateUse, error) {
	if raw == nil || string(raw) == "null" {
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
