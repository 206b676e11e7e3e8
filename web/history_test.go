package web_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/web"
)

// seedPoint is a history point written by the test, minutesAgo minutes
// before the database's now.
type seedPoint struct {
	minutesAgo                 int
	succeeded, failed, retried int64
	due, lagSeconds            *int64 // nil: not sampled
}

func ptr(n int64) *int64 { return &n }

// seedHistory writes points of behavior into the history table, and
// returns the start of each point's bucket, in ms since the epoch.
func (e *testEnv) seedHistory(behavior api.BehaviorID, points []seedPoint) []int64 {
	e.t.Helper()
	var at []int64
	for _, p := range points {
		var lagUS *int64
		if p.lagSeconds != nil {
			lagUS = ptr(*p.lagSeconds * 1e6)
		}
		var bucket time.Time
		require.NoError(e.t, e.st.Pool().QueryRow(e.ctx, `
			INSERT INTO stint_history (bucket, behavior, succeeded, failed, retried, due, lag_us)
			VALUES (date_bin('60 seconds', now() - make_interval(mins => $1), timestamptz 'epoch'), $2, $3, $4, $5, $6, $7)
			RETURNING bucket`, p.minutesAgo, behavior, p.succeeded, p.failed, p.retried, p.due, lagUS).Scan(&bucket))
		at = append(at, bucket.UnixMilli())
	}
	return at
}

// The history endpoint answers the database's points per behavior, and
// refuses bad windows and callers without a token.
func TestHistoryEndpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	at := e.seedHistory(idleKind.ID, []seedPoint{
		{minutesAgo: 30, succeeded: 6, failed: 2, retried: 1, due: ptr(4), lagSeconds: ptr(9)},
		{minutesAgo: 90, succeeded: 1},
	})

	var hist web.HistoryResponse
	e.json(http.MethodGet, "/api/v1/history", readToken, nil, http.StatusOK, &hist)
	require.Equal(t, 60, hist.BucketSeconds)
	require.WithinDuration(t, hist.Now.Add(-time.Hour), hist.From, time.Minute)
	var idle *web.BehaviorHistory
	for i := range hist.Behaviors {
		if hist.Behaviors[i].Behavior == idleKind.ID {
			idle = &hist.Behaviors[i]
		}
	}
	require.NotNil(t, idle, "%+v", hist)
	require.Equal(t, []web.HistoryPoint{{At: time.UnixMilli(at[0]).UTC(), Succeeded: 6, Failed: 2, Retried: 1, Sampled: true, Due: 4, QueueLagMS: 9000}},
		normalize(idle.Points), "the point of 90 minutes ago is outside the default window")

	e.json(http.MethodGet, "/api/v1/history?window=2h", readToken, nil, http.StatusOK, &hist)
	for _, b := range hist.Behaviors {
		if b.Behavior == idleKind.ID {
			require.Len(t, b.Points, 2, "a window of two hours has both points")
			require.True(t, b.Points[0].At.Before(b.Points[1].At), "oldest first")
		}
	}

	for _, bad := range []string{"abc", "0s", "30s", "25h", "-1h"} {
		e.requireError(http.MethodGet, "/api/v1/history?window="+bad, readToken, nil, http.StatusBadRequest, "invalid", "window")
	}
	e.requireError(http.MethodGet, "/api/v1/history?since=1h", readToken, nil, http.StatusBadRequest, "invalid", "since")
	e.requireError(http.MethodGet, "/api/v1/history", "", nil, http.StatusUnauthorized, "unauthorized", "")
}

// A task failed by hand counts in its behavior's history as a task that
// ended failed (failed, not retried), as the Failed card counts it, so
// that the charts show it.
func TestHistoryCountsTasksFailedByHand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.submit(web.SubmitBody{Behavior: idleKind.ID})
	e.json(http.MethodPost, "/api/v1/tasks/"+string(id)+"/fail", adminToken, web.FailBody{Reason: "test"}, http.StatusOK, nil)
	var hist web.HistoryResponse
	e.json(http.MethodGet, "/api/v1/history?window=15m", readToken, nil, http.StatusOK, &hist)
	var failed, retried int64
	for _, b := range hist.Behaviors {
		if b.Behavior == idleKind.ID {
			for _, p := range b.Points {
				failed, retried = failed+p.Failed, retried+p.Retried
			}
		}
	}
	require.Equal(t, []int64{1, 0}, []int64{failed, retried}, "%+v", hist)
}

// normalize drops the time zones of points' times, for comparison.
func normalize(ps []web.HistoryPoint) []web.HistoryPoint {
	for i := range ps {
		ps[i].At = ps[i].At.UTC()
	}
	return ps
}

// GET /metrics serves Config.Metrics to a read token, and is not there
// without it.
func TestMetricsEndpointNeedsAReadToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *web.Config) {
		c.Metrics = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("stint_up 1\n")) })
	})
	r := e.do(http.MethodGet, "/metrics", readToken, nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "stint_up 1\n", string(r.body))
	for _, token := range []string{"", "unknown-token-0123456789abcdef"} {
		require.Equal(t, http.StatusUnauthorized, e.do(http.MethodGet, "/metrics", token, nil).status, "token %q", token)
	}
	require.Equal(t, http.StatusMethodNotAllowed, e.do(http.MethodPost, "/metrics", readToken, nil).status)

	plain := newEnv(t)
	require.Equal(t, http.StatusNotFound, plain.do(http.MethodGet, "/metrics", readToken, nil).status, "no Config.Metrics, no /metrics")
}

// drawnChart is what a chart's SVG says of its scale, and its series'
// points as drawn.
type drawnChart struct {
	Plot   string            `json:"plot"`
	From   string            `json:"from"`
	To     string            `json:"to"`
	YMax   string            `json:"ymax"`
	Series map[string]string `json:"series"`
}

// values turns the series' drawn points back into (time ms, value) pairs
// by the chart's own scale.
func (c drawnChart) values(t *testing.T, series string) [][2]float64 {
	t.Helper()
	num := func(s string) float64 {
		f, err := strconv.ParseFloat(s, 64)
		require.NoError(t, err, "%q", s)
		return f
	}
	plot := strings.Fields(c.Plot)
	require.Len(t, plot, 4)
	px, py, pw, ph := num(plot[0]), num(plot[1]), num(plot[2]), num(plot[3])
	from, to, ymax := num(c.From), num(c.To), num(c.YMax)
	pts, ok := c.Series[series]
	require.True(t, ok, "no series %s", series)
	var out [][2]float64
	for _, xy := range strings.Fields(pts) {
		xs, ys, ok := strings.Cut(xy, ",")
		require.True(t, ok, "%q", xy)
		out = append(out, [2]float64{from + (num(xs)-px)/pw*(to-from), (py + ph - num(ys)) / ph * ymax})
	}
	return out
}

// The dashboard draws the history's charts itself, as SVG: for each
// behavior, the tasks ended per second (succeeded, failed for good) and
// the failed runs retried, the due backlog and the queue lag, with points
// where the database's counts put them, over the shortest window that
// holds the data (an hour's data: 1 h; five minutes': 15 min), or the
// window picked.
func TestHistoryChartsInBrowser(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	e := newEnv(t)
	at := e.seedHistory(idleKind.ID, []seedPoint{
		{minutesAgo: 50, succeeded: 120, failed: 30, due: ptr(40), lagSeconds: ptr(90)},
		{minutesAgo: 20, succeeded: 300, due: ptr(5), lagSeconds: ptr(12)},
		{minutesAgo: 5, succeeded: 60, failed: 60, retried: 30},
	})
	// A busier behavior, for the picture: within the hour even if a minute
	// turns before the page reads it.
	var wave []seedPoint
	for m := 58; m >= 1; m-- {
		x := float64(m)
		wave = append(wave, seedPoint{minutesAgo: m,
			succeeded: int64(600 + 400*math.Sin(x/6)), failed: int64(30 + 25*math.Sin(x/4+1)), retried: int64(10 + 8*math.Sin(x/4+1)),
			due: ptr(int64(200 + 180*math.Sin(x/9))), lagSeconds: ptr(int64(20 + 18*math.Sin(x/9)))})
	}
	e.seedHistory("ingest.job", wave)
	// A behavior with one task due once: its backlog axis counts whole
	// tasks.
	e.seedHistory(limitedKind.ID, []seedPoint{{minutesAgo: 30, succeeded: 1, due: ptr(1), lagSeconds: ptr(3)}})

	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Minute)
	defer cancel()
	tab, jsErrors := browser(t, ctx)
	shots := t.TempDir()
	err := chromedp.Do(tab,
		chromedp.Navigate(e.ts.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("token-input")),
		chromedp.SendKeys(chromedp.ID("token-input"), readToken),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(`#history svg[data-chart="lag"][data-behavior="test.idle"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#history svg[data-chart="finished"][data-behavior="ingest.job"]`)),
	)
	if errors.Is(err, context.DeadlineExceeded) {
		screenshot(t, tab, shots, "failed.png")
	}
	require.NoError(t, err, "see the charts")
	screenshot(t, tab, shots, "dashboard-history.png")

	charts, err := chromedp.Run(tab, chromedp.Evaluate[map[string]drawnChart](`(() => {
		const out = {};
		for (const svg of document.querySelectorAll('#history svg[data-behavior="test.idle"]')) {
			const series = {};
			for (const l of svg.querySelectorAll('polyline')) series[l.dataset.series] = l.getAttribute('points');
			out[svg.dataset.chart] = {plot: svg.dataset.plot, from: svg.dataset.from, to: svg.dataset.to, ymax: svg.dataset.ymax, series};
		}
		return out;
	})()`))
	require.NoError(t, err)
	require.Len(t, charts, 3, "finished, backlog and lag")

	// The busiest behaviors come first; a count's axis has whole numbers.
	order, err := chromedp.Run(tab, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#history .history-behavior')].map((el) => el.textContent)`))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(order), 3)
	require.Equal(t, []string{"ingest.job", "test.idle", string(limitedKind.ID)}, order[:3], "busy behaviors first, those with no data last")
	ticks, err := chromedp.Run(tab, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#history svg[data-chart="backlog"][data-behavior="`+
		string(limitedKind.ID)+`"] text.tick')].map((el) => el.textContent).filter((s) => !/−|now/.test(s))`))
	require.NoError(t, err)
	require.Equal(t, []string{"0", "1"}, ticks, "a backlog of one task is labelled in whole tasks")

	// near finds the drawn value at time ms, within the rounding of the
	// drawing (a hundredth of a unit of the 320-wide view box).
	near := func(pts [][2]float64, ms int64) (float64, bool) {
		for _, p := range pts {
			if math.Abs(p[0]-float64(ms)) < 60_000/4 {
				return p[1], true
			}
		}
		return 0, false
	}
	const tolerance = 0.02
	finished := charts["finished"]
	require.Equal(t, "1h", pressedWindow(t, tab), "an hour's data: the window of an hour")
	for series, want := range map[string][]float64{
		"succeeded": {120.0 / 60, 300.0 / 60, 60.0 / 60},
		// Tasks that ended failed: the failed runs less those retried.
		"failed":  {30.0 / 60, 0, 30.0 / 60},
		"retried": {0, 0, 30.0 / 60},
	} {
		pts := finished.values(t, series)
		require.Len(t, pts, 60, "%s: a point per minute of the hour, the current one left out", series)
		var total float64
		for _, p := range pts {
			total += p[1]
		}
		var wantTotal float64
		for i, w := range want {
			got, ok := near(pts, at[i])
			require.True(t, ok, "%s: a point at the seeded minute %d", series, i)
			require.InDelta(t, w, got, tolerance*w+0.01, "%s per second at the seeded minute %d", series, i)
			wantTotal += w
		}
		require.InDelta(t, wantTotal, total, 0.05, "%s: zero in every other minute", series)
	}
	require.Equal(t, "120", charts["lag"].YMax, "90 s rounds up to two minutes")
	for chart, want := range map[string][]float64{"backlog": {40, 5}, "lag": {90, 12}} {
		series := map[string]string{"backlog": "due", "lag": "lag"}[chart]
		pts := charts[chart].values(t, series)
		require.Len(t, pts, 2, "%s: only the sampled minutes", chart)
		for i, w := range want {
			got, ok := near(pts, at[i])
			require.True(t, ok, "%s: a point at the seeded minute %d", chart, i)
			require.InDelta(t, w, got, tolerance*w, "%s at the seeded minute %d", chart, i)
		}
	}

	// Picked windows: 6 h and 15 min, their axes labelled to match.
	span := func() (int64, []string) {
		t.Helper()
		out, err := chromedp.Run(tab, chromedp.Evaluate[struct {
			From, To string
			Ticks    []string
		}](`(() => { const svg = document.querySelector('#history svg[data-chart="finished"][data-behavior="test.idle"]');
			return {From: svg.dataset.from, To: svg.dataset.to, Ticks: [...svg.querySelectorAll('text.tick')].map((el) => el.textContent).filter((s) => /min|h|now/.test(s))} })()`))
		require.NoError(t, err)
		from, err := strconv.ParseInt(out.From, 10, 64)
		require.NoError(t, err)
		to, err := strconv.ParseInt(out.To, 10, 64)
		require.NoError(t, err)
		return to - from, out.Ticks
	}
	pick := func(window string) {
		t.Helper()
		require.NoError(t, chromedp.Do(tab, clickOn(`#history-window button[data-window="`+window+`"]`),
			void(chromedp.Poll[bool](`document.querySelector('#history-window [aria-pressed="true"]').dataset.window === `+jsString(window),
				chromedp.WithPollingTimeout(time.Minute)))))
	}
	pick("6h")
	require.NoError(t, chromedp.Do(tab, void(chromedp.Poll[bool](`document.querySelector('#history svg[data-chart="finished"][data-behavior="test.idle"]').dataset.to - document.querySelector('#history svg[data-chart="finished"][data-behavior="test.idle"]').dataset.from === 6 * 3600000`,
		chromedp.WithPollingTimeout(time.Minute)))))
	ms, ticks := span()
	require.Equal(t, int64(6*time.Hour/time.Millisecond), ms)
	require.Equal(t, []string{"−6 h", "−3 h", "now"}, ticks)
	pick("15m")
	require.NoError(t, chromedp.Do(tab, void(chromedp.Poll[bool](`document.querySelector('#history svg[data-chart="finished"][data-behavior="test.idle"]').dataset.to - document.querySelector('#history svg[data-chart="finished"][data-behavior="test.idle"]').dataset.from === 15 * 60000`,
		chromedp.WithPollingTimeout(time.Minute)))))
	_, ticks = span()
	require.Equal(t, []string{"−15 min", "−7.5 min", "now"}, ticks)

	// Five minutes of data, on a page opened afresh: the charts start at
	// the 15 minutes that hold it.
	_, err = e.st.Pool().Exec(e.ctx, `DELETE FROM stint_history WHERE bucket < now() - interval '10 minutes'`)
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(tab, chromedp.Reload(),
		chromedp.WaitVisible(chromedp.CSS(`#history svg[data-chart="finished"][data-behavior="ingest.job"]`))))
	require.Equal(t, "15m", pressedWindow(t, tab), "five minutes of data: the window of 15 minutes")
	ms, _ = span()
	require.Equal(t, int64(15*time.Minute/time.Millisecond), ms)
	screenshot(t, tab, shots, "dashboard-history-15m.png")
	require.Empty(t, jsErrors())
}

// pressedWindow returns the chart window the overview shows as picked.
func pressedWindow(t *testing.T, tab context.Context) string {
	t.Helper()
	w, err := chromedp.Run(tab, chromedp.Evaluate[string](`(() => { const b = document.querySelector('#history-window [aria-pressed="true"]'); return b ? b.dataset.window : '' })()`))
	require.NoError(t, err)
	return w
}
