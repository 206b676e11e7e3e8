package chaos

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// A ledger of what a failover test's client was told: the submits
// acknowledged, each with the primary's WAL position read after its
// acknowledgement, and the results Await returned.

// ledger is what the client was told. Safe for concurrent use.
type ledger struct {
	mu sync.Mutex
	// ids are the acknowledged tasks, in the order of their
	// acknowledgement.
	ids []api.TaskID
	// lsn is, per acknowledged task, the primary's WAL insert position
	// read after its submit returned: at or after its commit's.
	lsn map[api.TaskID]uint64
	// awaited is, per awaited task, the result Await returned.
	awaited map[api.TaskID]string
}

func newLedger() *ledger {
	return &ledger{lsn: map[api.TaskID]uint64{}, awaited: map[api.TaskID]string{}}
}

// acked returns a copy of the acknowledged ids.
func (l *ledger) acked() []api.TaskID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]api.TaskID(nil), l.ids...)
}

// parseLSN parses a pg_lsn's text ("16/B374D848").
func parseLSN(s string) (uint64, error) {
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
func (c *cluster) submitBatch(l *ledger, first, count int) ([]api.Submission, error) {
	reqs := make([]api.SubmitRequest, 0, count)
	for n := first; n < first+count; n++ {
		reqs = append(reqs, api.SubmitRequest{Behavior: workKind.ID, Params: fmt.Appendf(nil, `{"n":%d,"sleep_ms":%d}`, n, mrand.IntN(150))})
	}
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	subs, err := c.client.SubmitMany(ctx, reqs)
	if err != nil {
		return nil, err
	}
	var at string
	var lsn uint64
	// After the acknowledgement: the position is at or after the
	// commit's, whichever server answers (a new primary's is past the
	// old one's too).
	if err := c.pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&at); err == nil {
		lsn, err = parseLSN(at)
		require.NoError(c.t, err)
	} else {
		lsn = ^uint64(0) // unknown: after anything
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range subs {
		l.ids = append(l.ids, s.ID)
		l.lsn[s.ID] = lsn
	}
	return subs, nil
}

// load submits batches of 20 tasks, one after the other and at most one
// every 200 ms, from first on, until stop, retrying nothing (a failed
// batch's ids are skipped), and awaits the last task of every fifth batch
// in goroutines of its own, each until it finishes or the test ends. It returns once the submitter
// stopped; wait waits for the awaiters.
func (c *cluster) load(l *ledger, first int, stop <-chan struct{}) (wait func()) {
	// The awaiters give up with the test.
	ctx, cancel := context.WithCancel(c.ctx)
	c.t.Cleanup(cancel)
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
				task, err := c.client.Await(ctx, id)
				if err != nil {
					return // the test's deadline: the check says what is missing
				}
				l.mu.Lock()
				l.awaited[id] = string(task.Result)
				l.mu.Unlock()
			})
		}
		n += 20
	}
}

// toldThenLost returns the awaited tasks whose result in the database now
// is not the one Await returned: a finish an awaiter was told of that a
// failover then lost (the task ran again).
func (c *cluster) toldThenLost(l *ledger) []api.TaskID {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lost []api.TaskID
	for id, res := range l.awaited {
		task, err := c.client.Get(c.ctx, id)
		if err != nil || string(task.Result) != res {
			lost = append(lost, id)
		}
	}
	return lost
}

// stored returns the ids of the workload's tasks the database holds:
// those acknowledged and kept, and any a submit stored without
// acknowledging it.
func (c *cluster) stored() map[api.TaskID]bool {
	rows, err := c.pool.Query(c.ctx, `SELECT id FROM stint_task WHERE behavior = $1`, string(workKind.ID))
	require.NoError(c.t, err)
	defer rows.Close()
	out := map[api.TaskID]bool{}
	for rows.Next() {
		var id string
		require.NoError(c.t, rows.Scan(&id))
		out[api.TaskID(id)] = true
	}
	require.NoError(c.t, rows.Err())
	return out
}

// keys returns m's keys.
func keys(m map[api.TaskID]bool) []api.TaskID {
	out := make([]api.TaskID, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	return out
}

func TestParseLSN(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want uint64
		bad  bool
	}{
		{in: "0/0", want: 0},
		{in: "16/B374D848", want: 0x16_B374D848},
		{in: "FFFFFFFF/FFFFFFFF", want: ^uint64(0)},
		{in: "16B374D848", bad: true},
		{in: "x/1", bad: true},
		{in: "1/100000000", bad: true},
	} {
		got, err := parseLSN(c.in)
		if c.bad {
			require.Error(t, err, c.in)
			continue
		}
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, got, c.in)
	}
}
