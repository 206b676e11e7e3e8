package impl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	pg := func(code, msg string) error {
		return fmt.Errorf("claim: %w", &pgconn.PgError{Code: code, Message: msg})
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{pg("25006", "cannot execute INSERT in a read-only transaction"), CauseReadOnly},
		{pg("57P03", "the database system is starting up"), CauseRecovery},
		{pg("57P01", "terminating connection due to administrator command"), CauseShutdown},
		{pg("57P02", "terminating connection because of crash of another server process"), CauseShutdown},
		{pg("25P03", "terminating connection due to idle-in-transaction timeout"), CauseShutdown},
		{pg("53100", "could not extend file: No space left on device"), CauseDiskFull},
		{pg("53300", "sorry, too many clients already"), CauseConnections},
		{pg("08006", "connection failure"), CauseUnreachable},
		{pg("55000", "cannot execute LISTEN during recovery"), CauseRecovery},
		{fmt.Errorf("renew: %w", context.DeadlineExceeded), CauseUnreachable},
		{fmt.Errorf("finish: %w", io.ErrUnexpectedEOF), CauseUnreachable},
		{fmt.Errorf("connect: %w", pgconn.ErrReadOnlyConnection), CauseRecovery},
		// Not the database's failing: the call's own.
		{pg("23505", "duplicate key value violates unique constraint"), ""},
		{pg("42P01", "relation does not exist"), ""},
		{fmt.Errorf("claim: %w", context.Canceled), ""},
		{fmt.Errorf("checkpoint: %w", api.ErrHalt), ""},
		{errors.New("boom"), ""},
		{nil, ""},
	} {
		require.Equal(t, tc.want, classify(tc.err), "%v", tc.err)
	}
}

func TestUnavailableWrapsTheCause(t *testing.T) {
	t.Parallel()
	ro := &pgconn.PgError{Code: "25006", Message: "cannot execute INSERT in a read-only transaction"}
	err := unavailable(fmt.Errorf("submit: %w", ro))
	require.ErrorIs(t, err, api.ErrReadOnly)
	require.ErrorIs(t, err, api.ErrUnavailable)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.ErrorContains(t, err, "read_only")

	down := unavailable(fmt.Errorf("submit: %w", io.ErrUnexpectedEOF))
	require.ErrorIs(t, down, api.ErrUnavailable)
	require.NotErrorIs(t, down, api.ErrReadOnly)
	require.ErrorContains(t, down, "unreachable")

	dup := fmt.Errorf("submit: %w", &pgconn.PgError{Code: "23505"})
	require.Equal(t, dup, unavailable(dup), "an error of the call's own comes back as it is")
}

// records is a slog handler that keeps the messages and their causes.
type records struct {
	mu    sync.Mutex
	lines []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	cause := ""
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "cause" {
			cause = a.Value.String()
		}
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, rec.Message+" "+cause)
	return nil
}

func (r *records) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

func TestIncidentsLogOnceAndNeverStayFailed(t *testing.T) {
	t.Parallel()
	rec := &records{}
	reader := sdkmetric.NewManualReader()
	inc := newIncidents(slog.New(rec), sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	var changes atomic.Int64
	inc.change = func() { changes.Add(1) }
	ro := fmt.Errorf("claim: %w", &pgconn.PgError{Code: "25006"})

	// A thousand failures of one cause from every loop: one line.
	for range 1000 {
		require.True(t, inc.failed("claim", ro))
	}
	require.False(t, inc.failed("claim", errors.New("a bug, not an incident")))
	require.Equal(t, []string{msgStarted + " read_only"}, rec.get())
	h := inc.health()
	require.Len(t, h.Incidents, 1)
	require.Equal(t, CauseReadOnly, h.Incidents[0].Cause)
	require.Equal(t, 1000, h.Incidents[0].Failures)

	// A success, then a failure before it settles: the incident goes on.
	inc.ok(false)
	require.True(t, inc.failed("renew", ro))
	time.Sleep(2 * incidentSettle) // past the settle time of the success, which the failure cancelled
	require.Len(t, rec.get(), 1, "a failure right after a success continues the incident: %v", rec.get())

	// The listener's success ends no incident of the pool.
	inc.ok(true)
	time.Sleep(2 * incidentSettle) // past the settle time, were it started
	require.Len(t, rec.get(), 1)

	// A success that no failure follows ends it, with one line.
	inc.ok(false)
	require.Eventually(t, func() bool { return len(rec.get()) == 2 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, msgEnded+" read_only", rec.get()[1])
	h = inc.health()
	require.Empty(t, h.Incidents)
	require.NotNil(t, h.Last)
	require.Equal(t, CauseReadOnly, h.Last.Cause)
	require.False(t, h.Last.Ended.Before(h.Last.Started))

	// The next failure starts a new one: nothing is remembered as failed.
	require.True(t, inc.failed("claim", ro))
	require.Len(t, rec.get(), 3)
	require.EqualValues(t, 3, changes.Load(), "start, end, start")

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var counted int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "stint.db.incidents" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := dp.Attributes.Value(attribute.Key("cause"))
				require.Equal(t, CauseReadOnly, v.AsString())
				counted += dp.Value
			}
		}
	}
	require.EqualValues(t, 2, counted, "two incidents started")
}

// answeringStore is a store that can be told that the database answers
// again; nothing else of it is used.
type answeringStore struct {
	store.Store
	answered atomic.Int64
}

func (s *answeringStore) DatabaseAnswered() { s.answered.Add(1) }

// TestTheFirstSuccessAfterFailuresTellsTheStore checks that a client
// tells its store (the listener) that the database answers again at the
// first success of the pool after failures, once per such success, and
// not at the listener's own success or at successes that follow one.
func TestTheFirstSuccessAfterFailuresTellsTheStore(t *testing.T) {
	t.Parallel()
	st := &answeringStore{}
	c, err := NewClient(st, ClientConfig{Registry: spi.NewRegistry(), Logger: slog.New(&records{})})
	require.NoError(t, err)
	down := fmt.Errorf("claim: %w", io.ErrUnexpectedEOF)

	c.inc.ok(false)
	require.Zero(t, st.answered.Load(), "no incident: nothing to tell")
	require.True(t, c.inc.failed("claim", down))
	c.inc.listenerState(errors.New("listen: connect: timeout"))
	c.inc.ok(true)
	require.Zero(t, st.answered.Load(), "the listener's own success tells nothing")
	c.inc.ok(false)
	c.inc.ok(false)
	require.EqualValues(t, 1, st.answered.Load(), "the first success of the pool")
	require.True(t, c.inc.failed("renew", down))
	c.inc.ok(false)
	require.EqualValues(t, 2, st.answered.Load(), "the first success after a failure again")
}

// TestATimeoutIsAnIncidentOnlyIfAProbeFails: a call that outran its
// deadline starts no incident while a probe of the database answers (a
// statement on big rows was slow, not the database down), and says so in
// a line, once per incidentRepeat; when the probe fails too, an incident
// starts; while one is open, a timeout is one more failure of it, with no
// probe; a broken connection needs no probe.
func TestATimeoutIsAnIncidentOnlyIfAProbeFails(t *testing.T) {
	t.Parallel()
	rec := &records{}
	inc := newIncidents(slog.New(rec), sdkmetric.NewMeterProvider())
	var down atomic.Bool
	var probes atomic.Int64
	inc.probe = func(context.Context) error {
		probes.Add(1)
		if down.Load() {
			return fmt.Errorf("ping: %w", context.DeadlineExceeded)
		}
		return nil
	}
	settled := func() bool {
		inc.mu.Lock()
		defer inc.mu.Unlock()
		return !inc.probing
	}
	slow := fmt.Errorf("read claimed tasks: %w", context.DeadlineExceeded)

	for range 2 {
		require.True(t, inc.failed("claim", slow), "the tracker judges a timeout")
		require.Eventually(t, settled, 10*time.Second, time.Millisecond)
	}
	require.EqualValues(t, 2, probes.Load())
	require.Empty(t, inc.health().Incidents, "the database answered the probes")
	require.Equal(t, []string{msgSlow + " "}, rec.get(), "one line per incidentRepeat")

	down.Store(true)
	require.True(t, inc.failed("history", slow))
	require.Eventually(t, func() bool { return len(inc.health().Incidents) == 1 }, 10*time.Second, time.Millisecond)
	require.Equal(t, CauseUnreachable, inc.health().Incidents[0].Cause)
	require.Equal(t, msgStarted+" unreachable", rec.get()[1])
	require.True(t, inc.failed("renew", slow))
	require.EqualValues(t, 3, probes.Load(), "no probe while the incident is open")
	require.Equal(t, 2, inc.health().Incidents[0].Failures)

	eof := newIncidents(slog.New(&records{}), sdkmetric.NewMeterProvider())
	eof.probe = inc.probe
	require.True(t, eof.failed("claim", fmt.Errorf("claim: %w", io.ErrUnexpectedEOF)))
	require.Len(t, eof.health().Incidents, 1, "a broken connection starts an incident at once")
	require.EqualValues(t, 3, probes.Load())
}

// TestASlowStatementIsNoIncidentWhileTheDatabaseAnswers: a statement that
// outran its deadline on a database that answers (here it sleeps; a
// claim of big rows, say) starts no incident: the store's probe, which
// reads no payload, answers.
func TestASlowStatementIsNoIncidentWhileTheDatabaseAnswers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := postgres.Open(ctx, pgtest.New(t))
	require.NoError(t, err)
	t.Cleanup(st.Close)
	rec := &records{}
	c, err := NewClient(st, ClientConfig{Registry: spi.NewRegistry(), Logger: slog.New(rec)})
	require.NoError(t, err)
	t.Cleanup(c.Close)

	sctx, scancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = st.Pool().Exec(sctx, `SELECT pg_sleep(2)`)
	scancel()
	require.Error(t, err)
	require.True(t, c.inc.failed("history", err))
	require.Eventually(t, func() bool { return slices.Contains(rec.get(), msgSlow+" ") }, 30*time.Second, 10*time.Millisecond)
	open, _ := c.Incidents()
	require.Empty(t, open)
}
