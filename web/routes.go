package web

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// A path wildcard of the API may hold slashes as written: task ids do
// ("nightly/merge", an ingest job's "batch/3"), and so may group keys,
// rate-limit names and signal topics. A route "METHOD /prefix/{name}/suffix"
// whose wildcards are whole segments, each followed by literal segments
// (or the last by none), is a tail route: it is served for every path that
// starts with the prefix and ends with the suffix, whatever lies between
// being the wildcards' values, when no route of the mux matches the path.
// Of two wildcards, the first ends at the first place where the literal
// segments between them come: POST /tasks/a/b/signals/c/d signals the task
// a/b under the topic c/d. Of the routes of one method and prefix, those of
// more wildcards are tried first, then the longest suffix first. So
// POST /tasks/nightly/merge/retry retries the task nightly/merge. A slash
// written %2F is never a separator: an id that ends in the name of an
// action of the same method and prefix is written with its last slash as
// %2F, and so is the slash before a segment "signals" of a task's id in a
// POST (and before "nodes" of a workflow's).

// tailRoutes are the tail routes of one method and prefix.
type tailRoutes struct {
	method string
	// prefix is the escaped path before the wildcard, "/api/v1/tasks/".
	prefix string
	// routes are the routes, in the order they are tried.
	routes []tailRoute
}

// tailRoute is one route of a tailRoutes.
type tailRoute struct {
	// wildcards name the path values the handler reads, in the order of
	// the path: "id", or "id" and "topic".
	wildcards []string
	// between are the literal segments between two wildcards, with their
	// slashes: "/signals/". One fewer than wildcards.
	between []string
	// suffix is the literal end of the path, "/retry", or "" for a path
	// that ends with a wildcard.
	suffix  string
	handler http.Handler
}

// splitTailPattern splits the path of a route pattern that is a tail
// route into the part before its first wildcard, the route's wildcards and
// literals: "/tasks/{id}/signals/{topic}" is "/tasks/", with the wildcards
// id and topic, "/signals/" between them and no suffix. ok is false for a
// path of no wildcard, or of a wildcard that is not a whole segment,
// matches the rest ({x...}) or anchors the end ({$}).
func splitTailPattern(path string) (prefix string, rt tailRoute, ok bool) {
	open := strings.IndexByte(path, '{')
	if open < 1 || path[open-1] != '/' {
		return "", tailRoute{}, false
	}
	prefix, rest := path[:open], path[open:]
	for {
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			return "", tailRoute{}, false
		}
		wildcard := rest[1:end]
		if wildcard == "" || wildcard == "$" || strings.HasSuffix(wildcard, "...") || strings.ContainsAny(wildcard, "{/") {
			return "", tailRoute{}, false
		}
		rt.wildcards = append(rt.wildcards, wildcard)
		rest = rest[end+1:]
		next := strings.IndexByte(rest, '{')
		if next < 0 {
			if strings.ContainsRune(rest, '}') || (rest != "" && rest[0] != '/') {
				return "", tailRoute{}, false
			}
			rt.suffix = rest
			return prefix, rt, true
		}
		lit := rest[:next]
		if len(lit) < 3 || lit[0] != '/' || lit[len(lit)-1] != '/' || strings.ContainsRune(lit, '}') {
			return "", tailRoute{}, false
		}
		rt.between = append(rt.between, lit)
		rest = rest[next:]
	}
}

// shape writes the route's path after its prefix, its wildcards as
// written in the pattern: "{id}/signals/{topic}".
func (rt tailRoute) shape() string {
	var b strings.Builder
	for i, w := range rt.wildcards {
		if i > 0 {
			b.WriteString(rt.between[i-1])
		}
		b.WriteString("{" + w + "}")
	}
	return b.String() + rt.suffix
}

// add adds a route, keeping the routes in the order they are tried.
func (t *tailRoutes) add(rt tailRoute) error {
	for _, o := range t.routes {
		if o.suffix == rt.suffix && slices.Equal(o.between, rt.between) {
			return fmt.Errorf("%s%s conflicts with %s%s", t.prefix, rt.shape(), t.prefix, o.shape())
		}
	}
	t.routes = append(t.routes, rt)
	slices.SortStableFunc(t.routes, func(a, b tailRoute) int {
		if len(a.wildcards) != len(b.wildcards) {
			return len(b.wildcards) - len(a.wildcards)
		}
		return len(b.suffix) - len(a.suffix)
	})
	return nil
}

// match returns the route of r and its wildcards' values, unescaped.
func (t *tailRoutes) match(r *http.Request) (tailRoute, []string, bool) {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), t.prefix)
	if !ok {
		return tailRoute{}, nil, false
	}
	for _, rt := range t.routes {
		if values, ok := rt.match(rest, nil); ok {
			return rt, values, true
		}
	}
	return tailRoute{}, nil, false
}

// match matches rest, the escaped path after the prefix, from the
// wildcard len(values) on, and returns the values of all, unescaped: each
// wildcard but the last ends at the first of its literals after it that
// lets the rest match.
func (rt tailRoute) match(rest string, values []string) ([]string, bool) {
	i := len(values)
	if i == len(rt.wildcards)-1 {
		value, ok := strings.CutSuffix(rest, rt.suffix)
		return appendValue(values, value, ok)
	}
	lit := rt.between[i]
	for from := 0; ; {
		at := strings.Index(rest[from:], lit)
		if at < 0 {
			return nil, false
		}
		at += from
		if vs, ok := appendValue(values, rest[:at], true); ok {
			if vs, ok := rt.match(rest[at+len(lit):], vs); ok {
				return vs, true
			}
		}
		from = at + 1
	}
}

// appendValue appends value, unescaped, to values, when ok and value is a
// wildcard's: not empty, and not ending in a slash.
func appendValue(values []string, value string, ok bool) ([]string, bool) {
	if !ok || value == "" || strings.HasSuffix(value, "/") {
		return nil, false
	}
	v, err := url.PathUnescape(value)
	if err != nil {
		return nil, false
	}
	return append(slices.Clip(values), v), true
}

// hint tells a caller whose path has t's prefix but matched none of its
// routes which ending t's routes take: "; POST /api/v1/tasks/{id}/ACTION
// takes the actions fail, hold, release, retry", and the routes of more
// than one wildcard as they are ("; also POST
// /api/v1/tasks/{id}/signals/{topic}"). Empty for nil, or for routes with
// no suffix.
func (t *tailRoutes) hint(method string) string {
	if t == nil {
		return ""
	}
	var actions, others []string
	wildcard := ""
	for _, rt := range t.routes {
		switch {
		case len(rt.wildcards) > 1:
			others = append(others, method+" "+t.prefix+rt.shape())
		case rt.suffix != "":
			actions = append(actions, strings.TrimPrefix(rt.suffix, "/"))
			wildcard = rt.wildcards[0]
		}
	}
	var b strings.Builder
	if len(actions) > 0 {
		slices.Sort(actions)
		fmt.Fprintf(&b, "; %s %s{%s}/ACTION takes the actions %s", method, t.prefix, wildcard, strings.Join(actions, ", "))
	}
	for _, o := range others {
		b.WriteString("; also " + o)
	}
	return b.String()
}

// route registers handler under pattern ("METHOD /path", the path under
// apiPrefix): a tail route joins the routes of its method and prefix, any
// other pattern goes to the mux as it is.
func (h *Handler) route(pattern string, handler http.Handler) error {
	method, path, _ := strings.Cut(pattern, " ")
	prefix, rt, ok := splitTailPattern(path)
	if !ok {
		return registerRoute(h.mux, method+" "+apiPrefix+path, handler)
	}
	rt.handler = handler
	prefix = (&url.URL{Path: apiPrefix + prefix}).EscapedPath()
	i := slices.IndexFunc(h.tails, func(t *tailRoutes) bool { return t.method == method && t.prefix == prefix })
	if i < 0 {
		h.tails = append(h.tails, &tailRoutes{method: method, prefix: prefix})
		// The longest prefix first: the most specific wins.
		slices.SortStableFunc(h.tails, func(a, b *tailRoutes) int { return len(b.prefix) - len(a.prefix) })
		i = slices.IndexFunc(h.tails, func(t *tailRoutes) bool { return t.method == method && t.prefix == prefix })
	}
	return h.tails[i].add(rt)
}

// tailRoute returns the tail route of r and its wildcards' values, or the
// tail routes of r's method whose prefix r's path has (nil when none has)
// when no route of theirs matches.
func (h *Handler) tailRoute(r *http.Request) (tailRoute, []string, *tailRoutes) {
	method := r.Method
	if method == http.MethodHead {
		method = http.MethodGet // as the mux serves a GET route
	}
	var near *tailRoutes
	for _, t := range h.tails {
		if t.method != method {
			continue
		}
		if rt, values, ok := t.match(r); ok {
			return rt, values, nil
		}
		if near == nil && strings.HasPrefix(r.URL.EscapedPath(), t.prefix) {
			near = t
		}
	}
	return tailRoute{}, nil, near
}

// serveAPI serves the API paths that no pattern of the mux matched: a tail
// route's, or else the answer of apiFallback.
func (h *Handler) serveAPI(w http.ResponseWriter, r *http.Request) {
	rt, values, _ := h.tailRoute(r)
	if rt.handler == nil {
		h.apiFallback(w, r)
		return
	}
	for i, name := range rt.wildcards {
		r.SetPathValue(name, values[i])
	}
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
