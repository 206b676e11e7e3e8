package web

import "net/http"

// metricsPath is where Config.Metrics is served.
const metricsPath = "/metrics"

// serveMetrics serves GET /metrics with Config.Metrics (the Prometheus
// exposition of the process's OpenTelemetry metrics). It takes a token of
// the read role, like the API's reads: a Prometheus scrape job sends it
// with its authorization setting (type Bearer). With InsecureNoAuth it
// needs none.
func (h *Handler) serveMetrics(w http.ResponseWriter, r *http.Request) {
	role, aerr := h.authenticate(r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if role < RoleRead {
		writeError(w, &Error{Status: http.StatusForbidden, Code: CodeForbidden, Message: "this needs the read role"})
		return
	}
	h.cfg.Metrics.ServeHTTP(w, r)
}
