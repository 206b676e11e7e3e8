package spi

import (
	"bytes"
	"encoding/json"
	"net/url"
	"regexp"
	"strings"
	"unicode"

	"github.com/stinthq/stint/api"
)

// Redactor is implemented by behaviors whose params hold secrets that
// RedactParams does not find by itself: most mark them in their params
// type instead (a Secret, or a string field tagged `stint:"secret"` or
// `stint:"dsn"`), which needs no code. RedactParams returns p as readers
// may see it, the secrets replaced (e.g. by "xxxxx"). The params are stored
// as submitted: runs see them whole; every reader (the CLI, the HTTP API,
// the dashboard) sees them redacted.
type Redactor[P any] interface {
	RedactParams(p P) P
}

// redacted replaces a secret in shown params.
const redacted = "xxxxx"

// RedactParams returns the params raw of a task of behavior as readers may
// see them: the behavior's Redactor applied, if it has one; every field of
// its params type that is a Secret or tagged `stint:"secret"` replaced by
// "xxxxx", and every one tagged `stint:"dsn"` without its passwords (see
// RedactDSN); then, wherever they are, every password in a connection
// string (RedactSecrets) and every string value of a field named like a
// password or secret replaced by "xxxxx". raw is returned as it is when it
// holds nothing to redact. r may be nil: then only the generic rules apply.
func (r *Registry) RedactParams(behavior api.BehaviorID, raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return raw
	}
	var plan *secretPlan
	if r != nil {
		if reg, ok := r.Lookup(behavior); ok {
			if reg.redact != nil {
				if out, err := reg.redact(raw); err == nil {
					raw = out
				}
			}
			plan = reg.secrets
		}
	}
	return redactJSON(raw, plan)
}

// RedactTask replaces the params of t by what readers may see (see
// RedactParams), and its error's message by itself without the passwords
// of connection strings in it (RedactSecrets): a run's error may quote the
// DSN it failed to connect with.
func (r *Registry) RedactTask(t *api.Task) {
	t.Params = r.RedactParams(t.Behavior, t.Params)
	if t.Error != nil {
		if m := RedactSecrets(t.Error.Message); m != t.Error.Message {
			e := *t.Error
			e.Message = m
			t.Error = &e
		}
	}
}

// RedactSchedule replaces the params of s by what readers may see (see
// RedactParams).
func (r *Registry) RedactSchedule(s *api.Schedule) {
	s.Params = r.RedactParams(s.Behavior, s.Params)
}

// RedactTasks redacts the params of each of tasks in place (see
// RedactParams).
func (r *Registry) RedactTasks(tasks []api.Task) {
	for i := range tasks {
		r.RedactTask(&tasks[i])
	}
}

// secretKey matches the names of fields whose string values are secrets.
var secretKey = regexp.MustCompile(`(?i)(password|passwd|secret)`)

// redactJSON applies plan (which may be nil) and the generic rules of
// RedactParams to raw.
func redactJSON(raw json.RawMessage, plan *secretPlan) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return raw
	}
	changed := false
	if plan != nil {
		v, changed = plan.apply(v)
	}
	v, generic := redactValue(v, false)
	if !changed && !generic {
		return raw
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false) // shown as it was given: & stays &
	if err := enc.Encode(v); err != nil {
		return raw
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n"))
}

// redactValue redacts v, a decoded JSON value; secret says its field is
// named like a secret.
func redactValue(v any, secret bool) (any, bool) {
	switch v := v.(type) {
	case map[string]any:
		changed := false
		for k, e := range v {
			if ne, c := redactValue(e, secretKey.MatchString(k)); c {
				v[k], changed = ne, true
			}
		}
		return v, changed
	case []any:
		changed := false
		for i, e := range v {
			if ne, c := redactValue(e, secret); c {
				v[i], changed = ne, true
			}
		}
		return v, changed
	case string:
		if secret && v != "" && v != redacted {
			return redacted, true
		}
		if s := RedactSecrets(v); s != v {
			return s, true
		}
	}
	return v, false
}

// RedactSecrets returns s with the passwords of a connection string in it
// replaced by "xxxxx" (see RedactDSN).
func RedactSecrets(s string) string { return RedactDSN(s) }

// RedactDSN returns the connection string dsn with its passwords replaced
// by "xxxxx", for readers. Both of PostgreSQL's forms are understood:
//
//   - a URL (scheme://user:password@host/db?k=v): the password of the user
//     info, which ends at the last @ before the first / (so a password
//     with an @ or a ? is hidden whole, however a client splits it), and
//     the query parameters named like a password, secret, token or
//     signature;
//   - key=value pairs: the values of password and sslpassword read as
//     libpq reads them, single-quoted with backslash escapes (a quoted
//     value may hold spaces) or unquoted to the next white space, a
//     backslash escaping any character. An unterminated quote hides the
//     rest of the string.
//
// Any other text is returned as it is, but for key=value passwords in it.
func RedactDSN(dsn string) string {
	if strings.Contains(dsn, "://") {
		return redactURLs(dsn)
	}
	return kvPassword.ReplaceAllStringFunc(dsn, func(m string) string {
		k := kvPassword.FindStringSubmatch(m)[1]
		return k + "=" + redacted
	})
}

// kvPassword matches a password of a key=value connection string and its
// value, as libpq reads it: quoted with backslash escapes, a quote left
// open running to the end, or unquoted to white space.
var kvPassword = regexp.MustCompile(`(?is)(\w*password)\s*=\s*('(?:[^'\\]|\\.)*'|'.*|(?:[^\s'\\]|\\.|\\$)(?:[^\s\\]|\\.|\\$)*)`)

// secretQuery matches the names of URL query parameters whose values are
// secrets.
var secretQuery = regexp.MustCompile(`(?i)(pass(word|wd)?|secret|token|signature|api_?key)$`)

// redactURLs returns s with the user info passwords and the secret query
// parameters of each URL in it replaced by "xxxxx".
func redactURLs(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i+3])
		s = s[i+3:]
		end := strings.IndexFunc(s, unicode.IsSpace)
		if end < 0 {
			end = len(s)
		}
		b.WriteString(redactURL(s[:end]))
		s = s[end:]
	}
}

// redactURL redacts one URL, without its scheme and "://".
func redactURL(u string) string {
	var b strings.Builder
	authority, rest := u, ""
	if i := strings.IndexByte(u, '/'); i >= 0 {
		authority, rest = u[:i], u[i:]
	}
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		if c := strings.IndexByte(authority[:at], ':'); c >= 0 && authority[c+1:at] != "" {
			authority = authority[:c+1] + redacted + authority[at:]
		}
	}
	// The query starts at the first ? after the user info.
	q := strings.IndexByte(authority, '?')
	if q >= 0 {
		authority, rest = authority[:q], authority[q:]+rest
	} else if q = strings.IndexByte(rest, '?'); q >= 0 {
		b.WriteString(authority)
		authority, rest = rest[:q], rest[q:]
	}
	b.WriteString(authority)
	if rest == "" || rest[0] != '?' {
		b.WriteString(rest)
		return b.String()
	}
	query, fragment := rest[1:], ""
	if f := strings.IndexByte(query, '#'); f >= 0 {
		query, fragment = query[:f], query[f:]
	}
	pairs := strings.Split(query, "&")
	for i, p := range pairs {
		k, _, ok := strings.Cut(p, "=")
		if uk, err := url.QueryUnescape(k); err == nil {
			k = uk
		}
		if ok && secretQuery.MatchString(k) {
			name, _, _ := strings.Cut(p, "=")
			pairs[i] = name + "=" + redacted
		}
	}
	b.WriteString("?" + strings.Join(pairs, "&") + fragment)
	return b.String()
}
