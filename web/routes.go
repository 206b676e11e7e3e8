package web

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// A path wildcard of the API may hold slashes as written: task ids do
// ("nightly/merge", an ingest job's "batch/3"), and so may group keys and
// rate-limit names. A route "METHOD /prefix/{name}/suffix" whose only
// wildcard is a whole segment followed by literal segments (or by none) is
// a tail route: it is served for every path that starts with the prefix
// and ends with the suffix, whatever lies between being the wildcard's
// value, when no route of the mux matches the path. Of the routes of one
// method and prefix, the longest suffix that matches wins. So
// POST /tasks/nightly/merge/retry retries the task nightly/merge. A slash
// written %2F is never a separator: an id that ends in the name of an
// action of the same method and prefix is written with its last slash as
// %2F.

// tailRoutes are the tail routes of one method and prefix.
type tailRoutes struct {
	method string
	// prefix is the escaped path before the wildcard, "/api/v1/tasks/".
	prefix string
	// routes are the routes, the longest suffix first.
	routes []tailRoute
}

// tailRoute is one route of a tailRoutes.
type tailRoute struct {
	// wildcard names the path value the handler reads, "id".
	wildcard string
	// suffix is the literal end of the path, "/retry", or "" for a path
	// that ends with the wildcard.
	suffix  string
	handler http.Handler
}

// splitTailPattern splits the path of a route pattern that is a tail
// route into the part before its wildcard, the wildcard's name and the
// literal rest: "/tasks/{id}/hold" is "/tasks/", "id", "/hold". ok is false
// for a path of no wildcard, of more than one, or of a wildcard that is
// not a whole segment, matches the rest ({x...}) or anchors the end ({$}).
func splitTailPattern(path string) (prefix, wildcard, suffix string, ok bool) {
	open := strings.IndexByte(path, '{')
	if open < 0 || open == 0 || path[open-1] != '/' {
		return "", "", "", false
	}
	end := strings.IndexByte(path[open:], '}')
	if end < 0 {
		return "", "", "", false
	}
	wildcard, suffix = path[open+1:open+end], path[open+end+1:]
	if wildcard == "" || wildcard == "$" || strings.HasSuffix(wildcard, "...") ||
		strings.ContainsAny(suffix, "{}") || (suffix != "" && suffix[0] != '/') {
		return "", "", "", false
	}
	return path[:open], wildcard, suffix, true
}

// add adds a route, keeping the longest suffix first.
func (t *tailRoutes) add(rt tailRoute) error {
	for _, o := range t.routes {
		if o.suffix == rt.suffix {
			return fmt.Errorf("%s{%s}%s conflicts with %s{%s}%s", t.prefix, rt.wildcard, rt.suffix, t.prefix, o.wildcard, o.suffix)
		}
	}
	t.routes = append(t.routes, rt)
	slices.SortStableFunc(t.routes, func(a, b tailRoute) int { return len(b.suffix) - len(a.suffix) })
	return nil
}

// match returns the route of r and its wildcard's value, unescaped.
func (t *tailRoutes) match(r *http.Request) (tailRoute, string, bool) {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), t.prefix)
	if !ok {
		return tailRoute{}, "", false
	}
	for _, rt := range t.routes {
		value, ok := strings.CutSuffix(rest, rt.suffix)
		if !ok || value == "" || strings.HasSuffix(value, "/") {
			continue
		}
		if v, err := url.PathUnescape(value); err == nil {
			return rt, v, true
		}
	}
	return tailRoute{}, "", false
}

// hint tells a caller whose path has t's prefix but matched none of its
// routes which ending t's routes take: "; POST /api/v1/tasks/{id}/ACTION
// takes the actions fail, hold, release, retry". Empty for nil, or for
// routes with no suffix.
func (t *tailRoutes) hint(method string) string {
	if t == nil {
		return ""
	}
	var actions []string
	for _, rt := range t.routes {
		if rt.suffix != "" {
			actions = append(actions, strings.TrimPrefix(rt.suffix, "/"))
		}
	}
	if len(actions) == 0 {
		return ""
	}
	slices.Sort(actions)
	return fmt.Sprintf("; %s %s{%s}/ACTION takes the actions %s", method, t.prefix, t.routes[0].wildcard, strings.Join(actions, ", "))
}

// route registers handler under pattern ("METHOD /path", the path under
// apiPrefix): a tail route joins the routes of its method and prefix, any
// other pattern goes to the mux as it is.
func (h *Handler) route(pattern string, handler http.Handler) error {
	method, path, _ := strings.Cut(pattern, " ")
	prefix, wildcard, suffix, ok := splitTailPattern(path)
	if !ok {
		return registerRoute(h.mux, method+" "+apiPrefix+path, handler)
	}
	prefix = (&url.URL{Path: apiPrefix + prefix}).EscapedPath()
	i := slices.IndexFunc(h.tails, func(t *tailRoutes) bool { return t.method == method && t.prefix == prefix })
	if i < 0 {
		h.tails = append(h.tails, &tailRoutes{method: method, prefix: prefix})
		// The longest prefix first: the most specific wins.
		slices.SortStableFunc(h.tails, func(a, b *tailRoutes) int { return len(b.prefix) - len(a.prefix) })
		i = slices.IndexFunc(h.tails, func(t *tailRoutes) bool { return t.method == method && t.prefix == prefix })
	}
	return h.tails[i].add(tailRoute{wildcard: wildcard, suffix: suffix, handler: handler})
}

// tailRoute returns the tail route of r and its wildcard's value, or the
// tail routes of r's method whose prefix r's path has (nil when none has)
// when no route of theirs matches.
func (h *Handler) tailRoute(r *http.Request) (tailRoute, string, *tailRoutes) {
	method := r.Method
	if method == http.MethodHead {
		method = http.MethodGet // as the mux serves a GET route
	}
	var near *tailRoutes
	for _, t := range h.tails {
		if t.method != method {
			continue
		}
		if rt, value, ok := t.match(r); ok {
			return rt, value, nil
		}
		if near == nil && strings.HasPrefix(r.URL.EscapedPath(), t.prefix) {
			near = t
		}
	}
	return tailRoute{}, "", near
}

// serveAPI serves the API paths that no pattern of the mux matched: a tail
// route's, or else the answer of apiFallback.
func (h *Handler) serveAPI(w http.ResponseWriter, r *http.Request) {
	rt, value, _ := h.tailRoute(r)
	if rt.handler == nil {
		h.apiFallback(w, r)
		return
	}
	r.SetPathValue(rt.wildcard, value)
	rt.handler.ServeHTTP(w, r)
}

// routed reports whether a route serves r; near is as tailRoute says.
func (h *Handler) routed(r *http.Request) (ok bool, near *tailRoutes) {
	if _, pattern := h.mux.Handler(r); pattern != "" && pattern != apiPrefix+"/" {
		return true, nil
	}
	rt, _, near := h.tailRoute(r)
	return rt.handler != nil, near
}
