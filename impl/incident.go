package impl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// Causes of database incidents: why the database did not serve a call, as
// far as the error tells.
const (
	// CauseUnreachable: no connection could be made, or a connection
	// broke or stopped answering (a network cut or a silent loss, a
	// server that is down).
	CauseUnreachable = "unreachable"
	// CauseRecovery: the server is starting up, shutting down or in
	// recovery and accepts no connections (SQLSTATE 57P03), or no host of
	// a multi-host URL is a primary yet (a failover under way).
	CauseRecovery = "recovery"
	// CauseShutdown: the server ended the session (57P01, 57P02): a
	// restart, a failover, or an operator; or ended a transaction left
	// idle past its timeout (25P03), as it does to a node that froze
	// while it held what others wait for.
	CauseShutdown = "shutdown"
	// CauseReadOnly: the server refuses writes (25006): a standby, or
	// default_transaction_read_only turned on.
	CauseReadOnly = "read_only"
	// CauseDiskFull: the server cannot write for lack of room (53100).
	CauseDiskFull = "disk_full"
	// CauseConnections: the server has no connection to spare (53300).
	CauseConnections = "too_many_connections"
	// CauseListener: the process's listening connection failed while its
	// pool may work: notifications wait until it listens again, and
	// claimers and awaiters poll meanwhile.
	CauseListener = "listener"
)

// causeText says what each cause means, for errors and logs.
var causeText = map[string]string{
	CauseUnreachable: "the database cannot be reached or does not answer",
	CauseRecovery:    "the database is starting up, shutting down or in recovery, or no host is a primary",
	CauseShutdown:    "the database server ended the session (a restart or a failover)",
	CauseReadOnly:    "a standby, or default_transaction_read_only is on: no writes",
	CauseDiskFull:    "the database's disk is full",
	CauseConnections: "the database has no connection to spare",
	CauseListener:    "the listening connection failed; notifications wait, claimers and awaiters poll",
}

// classify returns the incident cause of err, or "" when err is not the
// database's failing (a bad statement, a constraint, a caller's cancel).
func classify(err error) string {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, api.ErrHalt) {
		return ""
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "25006":
			return CauseReadOnly
		case pgErr.Code == "57P03" || strings.Contains(pgErr.Message, "recovery"):
			return CauseRecovery
		case pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "25P03":
			return CauseShutdown
		case pgErr.Code == "53100":
			return CauseDiskFull
		case pgErr.Code == "53300":
			return CauseConnections
		case strings.HasPrefix(pgErr.Code, "08"):
			return CauseUnreachable
		}
		return ""
	}
	if errors.Is(err, pgconn.ErrReadOnlyConnection) || errors.Is(err, pgconn.ErrStandbyConnection) {
		return CauseRecovery
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connectErr) || errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, io.EOF) || errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err) ||
		strings.Contains(err.Error(), "conn closed") {
		return CauseUnreachable
	}
	return ""
}

// unavailable wraps err, when it is the database's failing, with
// api.ErrUnavailable (and api.ErrReadOnly for refused writes) and the
// cause's words; other errors come back as they are.
func unavailable(err error) error {
	cause := classify(err)
	if cause == "" {
		return err
	}
	sentinel := api.ErrUnavailable
	if cause == CauseReadOnly {
		sentinel = api.ErrReadOnly
	}
	return fmt.Errorf("%w (%s: %s): %w", sentinel, cause, causeText[cause], err)
}

// The lines an incident logs, and the line of a statement that outran
// its deadline while the database answered (see incidents.probe).
const (
	msgStarted = "stint: database incident started; retrying"
	msgGoesOn  = "stint: database incident goes on; retrying"
	msgEnded   = "stint: database incident ended"
	msgSlow    = "stint: a statement outran its deadline while the database answers; no incident"
)

// probeTimeout bounds the probe that tells a slow statement from a
// database that does not answer (see incidents.probe).
const probeTimeout = 5 * time.Second

// timedOut reports whether err is a call that outran its deadline.
func timedOut(err error) bool {
	var netErr net.Error
	return errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) || (errors.As(err, &netErr) && netErr.Timeout())
}

// incidentRepeat is how often an incident that goes on is logged again:
// one line when it starts, one every incidentRepeat while it lasts (with
// the failures counted meanwhile), one when it ends, whatever the number
// of loops and statements that fail.
const incidentRepeat = 10 * time.Second

// incidents tracks the database incidents of a process: each loop reports
// its database calls' failures (failed) and successes (ok), and the
// tracker turns them into one log line when an incident starts, one every
// incidentRepeat while it lasts, one when it ends, and a count in
// OpenTelemetry (stint.db.incidents, by cause). Nothing is ever
// remembered as failed: an incident ends at the next success.
type incidents struct {
	log     *slog.Logger
	counter metric.Int64Counter
	// anyOpen lets ok skip the lock when no incident is open: it follows
	// every successful statement of the hot path.
	anyOpen atomic.Bool

	mu     sync.Mutex
	open   map[string]*openIncident
	last   *api.NodeIncident // the last one that ended
	change func()            // called when an incident starts or ends, if set
	// unreachable, if set, is called when an incident of CauseUnreachable
	// starts.
	unreachable func()
	// answered, if set, is called when the pool succeeds after an
	// incident's failures: at its first success, and at the first after
	// each later failure. The database answers again, and the listener
	// need not wait out its backoff, or a connection attempt that the
	// incident left hanging, to listen again.
	answered func()
	// closed is set when the client closed: an incident that settles after
	// it neither logs nor reports a change.
	closed bool

	// probe, if set, asks the database a statement whose work does not
	// depend on the size of any payload. A call that only outran its
	// deadline (timedOut) says nothing of the database by itself: a
	// statement on big rows (a claim of tasks of a megabyte, a finish of
	// their results, a history sample waiting for a connection that
	// such statements hold) takes long while the database answers. It
	// starts an incident of CauseUnreachable only if the probe fails too,
	// or while one is open.
	probe func(context.Context) error
	// probing is set while a probe is out; slowLogged is when msgSlow was
	// last logged.
	probing    bool
	slowLogged time.Time
}

type openIncident struct {
	api.NodeIncident
	op       string    // the call that failed first
	logged   time.Time // when a line was last logged
	sinceLog int       // failures since
	// endAt is the time of the success that may end it, if no failure
	// comes within incidentSettle; zero while it fails.
	endAt time.Time
}

func newIncidents(log *slog.Logger, mp metric.MeterProvider) *incidents {
	c, _ := mp.Meter(instrumentationName).Int64Counter("stint.db.incidents",
		metric.WithDescription("Database incidents this process saw start, by cause (unreachable, recovery, shutdown, read_only, disk_full, too_many_connections, listener)."))
	return &incidents{log: log, counter: c, open: map[string]*openIncident{}}
}

// failed reports a failed database call of op. It returns whether err is
// a database incident, which the tracker logs; the caller logs any other
// error itself.
func (t *incidents) failed(op string, err error) bool {
	cause := classify(err)
	if cause == "" {
		return false
	}
	if cause == CauseUnreachable && t.probe != nil && timedOut(err) && t.startProbe() {
		go t.confirm(op, err)
		return true
	}
	t.fail(cause, op, err)
	return true
}

// startProbe reports whether a call that timed out is to be confirmed by
// a probe: unless an incident of CauseUnreachable is open (the call is
// one more failure of it), and only one probe at a time (the calls that
// time out meanwhile are judged by it).
func (t *incidents) startProbe() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open[CauseUnreachable] != nil {
		return false
	}
	if !t.probing {
		t.probing = true
		return true
	}
	return false
}

// confirm runs the probe for op, whose call failed with err, a timeout:
// if the probe fails, an incident starts (of the probe's cause); if it
// answers, op's statement was slow and the database up, which is logged
// once per incidentRepeat.
func (t *incidents) confirm(op string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	perr := t.probe(ctx)
	cancel()
	t.mu.Lock()
	t.probing = false
	now := time.Now()
	logSlow := perr == nil && !t.closed && now.Sub(t.slowLogged) >= incidentRepeat
	if logSlow {
		t.slowLogged = now
	}
	t.mu.Unlock()
	if perr != nil {
		t.fail(cmp.Or(classify(perr), CauseUnreachable), op, fmt.Errorf("%w (and a probe failed: %w)", err, perr))
		return
	}
	if logSlow {
		t.log.Warn(msgSlow, "op", op, "err", err)
	}
}

// fail records a failure of the given cause.
func (t *incidents) fail(cause, op string, err error) {
	now := time.Now()
	t.mu.Lock()
	in := t.open[cause]
	started := in == nil
	if started {
		in = &openIncident{NodeIncident: api.NodeIncident{Cause: cause, Started: now}, op: op, logged: now}
		t.open[cause] = in
		t.anyOpen.Store(true)
	}
	in.endAt = time.Time{} // it goes on
	in.Failures++
	in.sinceLog++
	in.Err = err.Error()
	repeat := !started && now.Sub(in.logged) >= incidentRepeat
	if repeat {
		in.logged = now
	}
	failures, sinceLog := in.Failures, in.sinceLog
	if repeat {
		in.sinceLog = 0
	}
	change, unreachable := t.change, t.unreachable
	t.mu.Unlock()
	if started && cause == CauseUnreachable && unreachable != nil {
		unreachable()
	}
	switch {
	case started:
		t.counter.Add(context.Background(), 1, metric.WithAttributes(attribute.String("cause", cause)))
		t.log.Warn(msgStarted, "cause", cause, "meaning", causeText[cause], "op", op, "err", err)
		if change != nil {
			change()
		}
	case repeat:
		t.log.Warn(msgGoesOn, "cause", cause, "since", in.Started.Format(time.RFC3339),
			"failures", failures, "failures_since_last_line", sinceLog, "op", op, "err", err)
	}
}

// incidentSettle is how long an incident must see no failure after a
// success before it counts as ended: after a silent loss, say, the pool's
// dead connections fail one statement each while new ones work, and the
// incident would otherwise end and start again with each.
const incidentSettle = time.Second

// ok reports a successful database call: it ends the open incidents it
// proves over, once incidentSettle passes without a failure of theirs. A
// success of the pool ends every incident but the listener's; the
// listener's own success (listening again) ends that one. A success of
// the pool that follows failures also tells the listener (answered).
func (t *incidents) ok(listener bool) {
	if !t.anyOpen.Load() {
		return
	}
	now := time.Now()
	t.mu.Lock()
	answeredAgain := false
	for cause, in := range t.open {
		if (cause == CauseListener) != listener || !in.endAt.IsZero() {
			continue
		}
		in.endAt = now
		answeredAgain = !listener
		time.AfterFunc(incidentSettle, func() { t.settle(cause, in, now) })
	}
	answered := t.answered
	t.mu.Unlock()
	if answeredAgain && answered != nil {
		answered()
	}
}

// close stops the incidents' reports: what settles later is not logged.
func (t *incidents) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
}

// settle ends the incident in, of cause, if no failure came since its
// success at.
func (t *incidents) settle(cause string, in *openIncident, at time.Time) {
	t.mu.Lock()
	if t.closed || t.open[cause] != in || !in.endAt.Equal(at) {
		t.mu.Unlock()
		return
	}
	delete(t.open, cause)
	in.Ended = at
	last := in.NodeIncident
	t.last = &last
	t.anyOpen.Store(len(t.open) > 0)
	change := t.change
	t.mu.Unlock()
	t.log.Info(msgEnded, "cause", in.Cause, "at", at, "lasted", in.Ended.Sub(in.Started).Round(time.Millisecond),
		"failures", in.Failures)
	if change != nil {
		change()
	}
}

// listenerState is the hub's report of its listening connection.
func (t *incidents) listenerState(err error) {
	if err == nil {
		t.ok(true)
		return
	}
	t.fail(CauseListener, "listen", err)
}

// health returns the node's state: the open incidents, oldest first, and
// the last one that ended.
func (t *incidents) health() store.NodeHealth {
	t.mu.Lock()
	defer t.mu.Unlock()
	var h store.NodeHealth
	for _, in := range t.open {
		h.Incidents = append(h.Incidents, in.NodeIncident)
	}
	slices.SortFunc(h.Incidents, func(a, b api.NodeIncident) int { return a.Started.Compare(b.Started) })
	if t.last != nil {
		last := *t.last
		h.Last = &last
	}
	return h
}
