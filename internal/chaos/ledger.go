package chaos

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// Ledger is what a client was told, for the tests that compare it with
// the database after a failover or a restore: the submits acknowledged,
// each with the primary's WAL position read after its acknowledgement,
// and the results Await returned. Safe for concurrent use.
type Ledger struct {
	mu sync.Mutex
	// ids are the acknowledged tasks, in the order of their
	// acknowledgement.
	ids []api.TaskID
	// LSN is, per acknowledged task, the primary's WAL insert position
	// read after its submit returned: at or after its commit's.
	LSN map[api.TaskID]uint64
	// Awaited is, per awaited task, the result Await returned.
	Awaited map[api.TaskID]string
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{LSN: map[api.TaskID]uint64{}, Awaited: map[api.TaskID]string{}}
}

// Acked returns a copy of the acknowledged ids.
func (l *Ledger) Acked() []api.TaskID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]api.TaskID(nil), l.ids...)
}

// ParseLSN parses a pg_lsn's text ("16/B374D848").
func ParseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("parse LSN %q: no slash", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("parse LSN %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("parse LSN %q: %w", s, err)
	}
	return h<<32 | l, nil
}

// submitBatch submits tasks first..first+count-1 once, and on success
// records them in the ledger with the primary's WAL insert position read
// after the acknowledgement. A failed submit is left out: the caller
// moves on to other ids, so a submit whose outcome it never learnt is
// not counted either way.
func (c *Cluster) submitBatch(l *Ledger, first, count int) ([]api.Submission, error) {
	reqs := make([]api.SubmitRequest, 0, count)
	for n := first; n < first+count; n++ {
		reqs = append(reqs, api.SubmitRequest{Behavior: WorkKind.ID, Params: fmt.Appendf(nil, `{"n":%d,"sleep_ms":%d}`, n, mrand.IntN(150))})
	}
	ctx, cancel := context.WithTimeout(c.Ctx, 10*time.Second)
	defer cancel()
	subs, err := c.Client.SubmitMany(ctx, reqs)
	if err != nil {
		return nil, err
	}
	ids := make([]api.TaskID, len(subs))
	for i, s := range subs {
		ids[i] = s.ID
	}
	c.Acknowledged(ctx, l, ids...)
	return subs, nil
}

// Acknowledged records ids, whose submit was acknowledged just now, in l
// with the primary's WAL insert position read now: at or after their
// commit's, whichever server answers (a new primary's is past the old
// one's too). When the position cannot be read, it is taken to be after
// any.
func (c *Cluster) Acknowledged(ctx context.Context, l *Ledger, ids ...api.TaskID) {
	var at string
	var lsn uint64
	if err := c.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&at); err == nil {
		lsn, err = ParseLSN(at)
		require.NoError(c.T, err)
	} else {
		lsn = ^uint64(0)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		l.ids = append(l.ids, id)
		l.LSN[id] = lsn
	}
}

// Load submits batches of 20 tasks, one after the other and at most one
// every 200 ms, from first on, until stop, retrying nothing (a failed
// batch's ids are skipped), and awaits the last task of every fifth batch
// in goroutines of its own, each until it finishes or the test ends. It returns once the submitter
// stopped; wait waits for the awaiters.
func (c *Cluster) Load(l *Ledger, first int, stop <-chan struct{}) (wait func()) {
	// The awaiters give up with the test.
	ctx, cancel := context.WithCancel(c.Ctx)
	c.T.Cleanup(cancel)
	var awaiters sync.WaitGroup
	n, batch := first, 0
	for {
		select {
		case <-stop:
			return awaiters.Wait
		default:
		}
		// A batch every 200 ms at most: a steady load (100 tasks a
		// second) rather than as many as the machine takes, whose backlog
		// the check would wait out, and which slowed the servers'
		// connections on a busy machine past pg_autoctl's 2 s connect
		// timeout.
		next := time.Now().Add(200 * time.Millisecond)
		subs, err := c.submitBatch(l, n, 20)
		time.Sleep(time.Until(next)) // the load's pace
		if batch++; err == nil && batch%5 == 0 {
			id := subs[len(subs)-1].ID
			awaiters.Go(func() {
				task, err := c.Client.Await(ctx, id)
				if err != nil {
					return // the test's deadline: the check says what is missing
				}
				l.mu.Lock()
				l.Awaited[id] = string(task.Result)
				l.mu.Unlock()
			})
		}
		n += 20
	}
}

// ToldThenLost returns the awaited tasks whose result in the database now
// is not the one Await returned: a finish an awaiter was told of that a
// failover then lost (the task ran again).
func (c *Cluster) ToldThenLost(l *Ledger) []api.TaskID {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lost []api.TaskID
	for id, res := range l.Awaited {
		task, err := c.Client.Get(c.Ctx, id)
		if err != nil || string(task.Result) != res {
			lost = append(lost, id)
		}
	}
	return lost
}

// Stored returns the ids of the workload's tasks the database holds:
// those acknowledged and kept, and any a submit stored without
// acknowledging it.
func (c *Cluster) Stored() map[api.TaskID]bool {
	rows, err := c.Pool.Query(c.Ctx, `SELECT id FROM stint_task WHERE behavior = $1`, string(WorkKind.ID))
	require.NoError(c.T, err)
	defer rows.Close()
	out := map[api.TaskID]bool{}
	for rows.Next() {
		var id string
		require.NoError(c.T, rows.Scan(&id))
		out[api.TaskID(id)] = true
	}
	require.NoError(c.T, rows.Err())
	return out
}

// Keys returns m's keys.
func Keys(m map[api.TaskID]bool) []api.TaskID {
	out := make([]api.TaskID, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	return out
}
