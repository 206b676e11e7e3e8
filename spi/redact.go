package spi

import (
	"bytes"
	"encoding/json"
	"net/url"
	"regexp"
	"strings"

	"github.com/stinthq/stint/api"
)

// Redactor is implemented by behaviors whose params hold secrets that
// RedactParams does not find by itself. RedactParams returns p as readers
// may see it, the secrets replaced (e.g. by "xxxxx"). The params are stored
// as submitted: runs see them whole; every reader (the CLI, the HTTP API,
// the dashboard) sees them redacted.
type Redactor[P any] interface {
	RedactParams(p P) P
}

// redacted replaces a secret in shown params.
const redacted = "xxxxx"

// RedactParams returns the params raw of a task of behavior as readers may
// see them: the behavior's Redactor applied, if it has one, then every
// password in a connection string (a URL's user info or password query
// parameter, or a key=value password) and every string value of a field
// named like a password or secret replaced by "xxxxx". raw is returned
// as it is when it holds nothing to redact. r may be nil: then only the
// generic rules apply.
func (r *Registry) RedactParams(behavior api.BehaviorID, raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return raw
	}
	if r != nil {
		if reg, ok := r.Lookup(behavior); ok && reg.redact != nil {
			if out, err := reg.redact(raw); err == nil {
				raw = out
			}
		}
	}
	return redactJSON(raw)
}

// RedactTask replaces the params of t by what readers may see (see
// RedactParams).
func (r *Registry) RedactTask(t *api.Task) {
	t.Params = r.RedactParams(t.Behavior, t.Params)
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

// kvPassword matches the password of a key=value connection string.
var kvPassword = regexp.MustCompile(`(?i)\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)

// redactJSON applies the generic rules of RedactParams to raw.
func redactJSON(raw json.RawMessage) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return raw
	}
	v, changed := redactValue(v, false)
	if !changed {
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

// RedactSecrets returns s with the password of a connection string in it
// replaced by "xxxxx": a URL's user info password and password query
// parameter, and the value of a key=value password.
func RedactSecrets(s string) string {
	if strings.Contains(s, "://") {
		if u, err := url.Parse(s); err == nil && u.User != nil {
			if _, has := u.User.Password(); has {
				u.User = url.UserPassword(u.User.Username(), redacted)
				s = u.String()
			}
		}
		if u, err := url.Parse(s); err == nil && u.Query().Has("password") {
			q := u.Query()
			q.Set("password", redacted)
			u.RawQuery = q.Encode()
			s = u.String()
		}
		return s
	}
	return kvPassword.ReplaceAllStringFunc(s, func(m string) string {
		if strings.HasSuffix(m, "="+redacted) {
			return m
		}
		k, _, _ := strings.Cut(m, "=")
		return k + "=" + redacted
	})
}
