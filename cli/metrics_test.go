package cli

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/syncbuf"
	"github.com/stinthq/stint/spi"
)

// The test's tokens.
const (
	metricsReadToken  = "metrics-read-token-0123456789"
	metricsAdminToken = "metrics-admin-token-0123456789"
)

// scrape gets base/metrics with token and parses it with Prometheus' text
// parser, or returns the status of a refusal.
func scrape(t *testing.T, ctx context.Context, base, token string) (map[string]*dto.MetricFamily, int) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, resp.StatusCode
	}
	require.Contains(t, resp.Header.Get("Content-Type"), "text/plain")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return families, resp.StatusCode
}

// value returns the value of the series of family name whose labels
// include labels, and whether there is one.
func value(families map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	f := families[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range labels {
			match = match && got[k] == v
		}
		if !match {
			continue
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue(), true
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue(), true
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// A server with --http serves its metrics at /metrics in the Prometheus
// text format, through OpenTelemetry's Prometheus exporter, to a read
// token: the cluster's tasks, backlog and queue lag from the database, the
// node's running tasks, starts, finishes, retries, takeovers and claim
// durations, under Prometheus' names. Every metric the Grafana dashboard
// in deploy/grafana queries is among them.
func TestServerServesPrometheusMetrics(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 3*time.Minute)
	dsn := pgtest.New(t)

	base, stop := serveHTTP(t, ctx, nil, "--db", dsn, "--node", "metrics-node", "--behaviors", "demo.echo",
		"--token", "read:"+metricsReadToken, "--token", "admin:"+metricsAdminToken)

	const runs = 3
	for range runs {
		requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"hi"}`, "--wait", "--db", dsn))
	}
	// Paused, the behavior's next tasks wait: a backlog and a queue lag.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/behaviors/demo.echo/pause", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+metricsAdminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	const waiting = 2
	for range waiting {
		requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"later"}`, "--db", dsn))
	}
	// A rate limit and a cap, whose gauges are served too.
	requireOK(t, runCLI(ctx, "limits", "set", "rate", "metrics-api", "--limit", "5", "--period", "1m", "--db", dsn))
	requireOK(t, runCLI(ctx, "limits", "set", "concurrency", "demo.echo", "--key", "k", "--max", "3", "--db", dsn))

	for _, token := range []string{"", "not-a-known-token-0123456789"} {
		_, status := scrape(t, ctx, base, token)
		require.Equal(t, http.StatusUnauthorized, status, "token %q", token)
	}
	echo := map[string]string{"behavior": "demo.echo"}
	var families map[string]*dto.MetricFamily
	waitFor(t, time.Minute, "the finishes and the backlog in the scrape", func() bool {
		var status int
		families, status = scrape(t, ctx, base, metricsReadToken)
		require.Equal(t, http.StatusOK, status)
		finished, _ := value(families, "stint_task_finishes_total", map[string]string{"behavior": "demo.echo", "outcome": "success"})
		due, _ := value(families, "stint_due_backlog", echo)
		lag, _ := value(families, "stint_queue_lag_seconds", echo)
		return finished == runs && due == waiting && lag > 0
	})
	for name, want := range map[string]dto.MetricType{
		"stint_tasks":                     dto.MetricType_GAUGE,
		"stint_due_backlog":               dto.MetricType_GAUGE,
		"stint_queue_lag_seconds":         dto.MetricType_GAUGE,
		"stint_running_tasks":             dto.MetricType_GAUGE,
		"stint_workflows":                 dto.MetricType_GAUGE,
		"stint_task_starts_total":         dto.MetricType_COUNTER,
		"stint_task_finishes_total":       dto.MetricType_COUNTER,
		"stint_task_retries_total":        dto.MetricType_COUNTER,
		"stint_task_waits_total":          dto.MetricType_COUNTER,
		"stint_takeovers_total":           dto.MetricType_COUNTER,
		"stint_claim_duration_seconds":    dto.MetricType_HISTOGRAM,
		"stint_rate_limit_used":           dto.MetricType_GAUGE,
		"stint_rate_limit_waiting":        dto.MetricType_GAUGE,
		"stint_concurrency_limit_running": dto.MetricType_GAUGE,
		"stint_concurrency_limit_waiting": dto.MetricType_GAUGE,
	} {
		require.Contains(t, families, name)
		require.Equal(t, want, families[name].GetType(), name)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"stint_tasks", map[string]string{"behavior": "demo.echo", "status": "success"}, runs},
		{"stint_tasks", map[string]string{"behavior": "demo.echo", "status": "scheduled"}, waiting},
		{"stint_tasks", map[string]string{"behavior": "demo.echo", "status": "held"}, 0},
		{"stint_tasks", map[string]string{"behavior": "demo.echo", "status": "waiting"}, 0},
		{"stint_workflows", map[string]string{"state": "running"}, 0},
		{"stint_workflows", map[string]string{"state": "failed"}, 0},
		{"stint_task_starts_total", echo, runs},
		{"stint_task_finishes_total", map[string]string{"behavior": "demo.echo", "outcome": "failure"}, 0},
		{"stint_task_retries_total", echo, 0},
		{"stint_running_tasks", map[string]string{"node": "metrics-node"}, 0},
		{"stint_takeovers_total", nil, 0},
		{"stint_rate_limit_used", map[string]string{"rate_limit": "metrics-api"}, 0},
		{"stint_rate_limit_waiting", map[string]string{"rate_limit": "metrics-api"}, 0},
		{"stint_concurrency_limit_running", map[string]string{"behavior": "demo.echo", "group_key": "k"}, 0},
		{"stint_concurrency_limit_waiting", map[string]string{"behavior": "demo.echo", "group_key": "k"}, 0},
	} {
		got, ok := value(families, c.name, c.labels)
		require.True(t, ok, "%s%v is served", c.name, c.labels)
		require.Equal(t, c.want, got, "%s%v", c.name, c.labels)
	}
	claims, _ := value(families, "stint_claim_duration_seconds", nil)
	require.Positive(t, claims, "claims were timed")

	for _, name := range grafanaMetrics(t) {
		require.Contains(t, families, name, "the Grafana dashboard queries %s", name)
	}
	stop()
}

// serveHTTP runs `stint server --http 127.0.0.1:0` with args and the
// behaviors of reg until stop, which waits for its end and fails the test
// unless it exits with 0, and returns the base URL it serves.
func serveHTTP(t *testing.T, ctx context.Context, reg *spi.Registry, args ...string) (base string, stop func()) {
	t.Helper()
	srvCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	var stdout, stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Run(srvCtx, append([]string{"server", "--http", "127.0.0.1:0"}, args...), reg, strings.NewReader(""), &stdout, &stderr)
	}()
	dashboard := regexp.MustCompile(`dashboard: (https?://\S+)/`)
	waitFor(t, time.Minute, "the HTTP server", func() bool { return dashboard.MatchString(stdout.String()) })
	return dashboard.FindStringSubmatch(stdout.String())[1], func() {
		t.Helper()
		cancel()
		require.Equal(t, exitOK, <-done, stderr.String())
	}
}

// grafanaMetrics returns the metric names that the queries of the Grafana
// dashboard in deploy/grafana use (of its panels and its variables), a
// histogram's series named by their family.
func grafanaMetrics(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("../deploy/grafana/stint.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	var exprs []string
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %q", p.Title)
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	name := regexp.MustCompile(`\bstint_[a-z_]+\b`)
	seen := map[string]bool{}
	var names []string
	for _, e := range exprs {
		found := name.FindAllString(e, -1)
		require.NotEmpty(t, found, "query %q names no stint metric", e)
		for _, n := range found {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if strings.HasSuffix(n, "_seconds"+suffix) {
					n = strings.TrimSuffix(n, suffix)
				}
			}
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	require.GreaterOrEqual(t, len(names), 9, "the dashboard's metrics: %v", names)
	return names
}

// declared is test.declared: its tasks take a unit of the rate limit
// declared-api, which its policy declares.
type declared struct{ limited }

var declaredKind = api.Kind[limitedParams, struct{}]{ID: "test.declared"}

func (declared) Kind() api.Kind[limitedParams, struct{}] { return declaredKind }

func (declared) RateUses(p limitedParams) []spi.RateUse {
	return []spi.RateUse{{Limit: "declared-api", Key: p.Customer}}
}

func (declared) Policy() spi.Policy {
	return spi.Policy{RateLimits: []api.RateLimit{{Name: "declared-api", Limit: 10, Period: time.Minute}}}
}

// TestMetricsExistFromTheStart scrapes a server that has run nothing yet:
// every series a dashboard graphs is there at zero, for each behavior the
// node runs and each rate limit its behaviors declare, so that a new panel
// shows 0 rather than "no data". The submits counter is named for what it
// counts, this process's own submits.
func TestMetricsExistFromTheStart(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	reg := spi.NewRegistry()
	require.NoError(t, spi.Register(reg, spi.Behavior[limitedParams, struct{}](declared{})))

	base, stop := serveHTTP(t, ctx, reg, "--db", dsn, "--node", "fresh-node", "--behaviors", "demo.echo,test.declared",
		"--token", "read:"+metricsReadToken)
	families, status := scrape(t, ctx, base, metricsReadToken)
	require.Equal(t, http.StatusOK, status)

	type series struct {
		name   string
		labels map[string]string
	}
	want := []series{
		{"stint_lease_renewals_total", nil},
		{"stint_takeovers_total", nil},
		{"stint_rate_limit_used", map[string]string{"rate_limit": "declared-api"}},
		{"stint_rate_limit_waiting", map[string]string{"rate_limit": "declared-api"}},
	}
	for _, b := range []string{"demo.echo", "test.declared"} {
		want = append(want,
			series{"stint_task_delays_total", map[string]string{"behavior": b}},
			series{"stint_task_starts_total", map[string]string{"behavior": b}},
			series{"stint_task_finishes_total", map[string]string{"behavior": b, "outcome": "success"}},
			series{"stint_task_finishes_total", map[string]string{"behavior": b, "outcome": "failure"}},
			series{"stint_task_retries_total", map[string]string{"behavior": b}},
			series{"stint_task_waits_total", map[string]string{"behavior": b, "reason": "signal"}},
			series{"stint_task_waits_total", map[string]string{"behavior": b, "reason": "snooze"}},
			series{"stint_client_submits_total", map[string]string{"behavior": b}},
			series{"stint_tasks", map[string]string{"behavior": b, "status": "scheduled"}},
			series{"stint_due_backlog", map[string]string{"behavior": b}},
		)
	}
	for _, s := range want {
		got, ok := value(families, s.name, s.labels)
		require.True(t, ok, "%s%v is served before its first use", s.name, s.labels)
		require.Zero(t, got, "%s%v", s.name, s.labels)
	}
	require.NotContains(t, families, "stint_tasks_submitted_total", "the submits counter is named for what it counts")

	// Another process's submit reaches the database, not this node's
	// counter of its own submits.
	requireOK(t, runCLI(ctx, "submit", "demo.echo", "--params", `{"text":"hi"}`, "--wait", "--db", dsn))
	echo := map[string]string{"behavior": "demo.echo"}
	waitFor(t, time.Minute, "the run in the scrape", func() bool {
		families, _ = scrape(t, ctx, base, metricsReadToken)
		started, _ := value(families, "stint_task_starts_total", echo)
		return started == 1
	})
	submits, _ := value(families, "stint_client_submits_total", echo)
	require.Zero(t, submits)
	stop()
}
