package spi

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/stinthq/stint/api"
)

// Limits of JSON values PostgreSQL's jsonb stores, which Go's encoding/json
// accepts beyond.
const (
	// MaxJSONDepth is the deepest nesting of arrays and objects in params.
	// PostgreSQL's JSON parser recurses once per level, and fails past
	// its max_stack_depth (at about 10,000 levels with the default 2 MB,
	// fewer where it is set lower); no params need a tenth of this.
	MaxJSONDepth = 1000
	// maxNumericIntegerDigits is how many digits before the decimal point
	// PostgreSQL's numeric holds.
	maxNumericIntegerDigits = 131072
	// maxNumericScale is how many digits after the decimal point
	// PostgreSQL's numeric holds.
	maxNumericScale = 16383
	// maxNumericExponent bounds the exponents numeric reads, even of zero.
	maxNumericExponent = 1<<30 - 1
)

// CheckJSONB checks that raw, valid JSON named by field (e.g. "params"),
// is stored by PostgreSQL's jsonb as it is, which Go's encoding/json does
// not ensure: no NUL character (\u0000) and no lone UTF-16 surrogate
// escape (\ud800 without the \udc00-\udfff that pairs it) in a string or
// an object key, every number within numeric's range (131,072 digits
// before the decimal point, 16,383 after), and at most MaxJSONDepth levels
// of nesting. Its error is an *api.InvalidError naming the offending
// member's path, e.g. params.items[2].text. raw must be valid JSON (as
// json.Valid reports); a value that is not gets an error naming field.
//
// The engine checks params with it before they are stored, whatever the
// way in (the Go API, the HTTP API, the CLI, a schedule), so that
// PostgreSQL never refuses them (a 500 that should be a 400).
func CheckJSONB(field string, raw []byte) error {
	c := jsonbChecker{raw: raw, field: field}
	return c.value(0)
}

// jsonbChecker walks a JSON text, keeping the path to where it is.
type jsonbChecker struct {
	raw   []byte
	pos   int
	field string
	path  []member // the members it is in, outermost first
}

// member is an object's member by its key (raw, escapes as they are), or
// an array's by its index.
type member struct {
	key   []byte
	index int
}

// invalid returns the error of the value at the current path.
func (c *jsonbChecker) invalid(format string, args ...any) error {
	var b strings.Builder
	b.WriteString(c.field)
	for _, m := range c.path {
		switch {
		case m.key == nil:
			b.WriteString("[" + strconv.Itoa(m.index) + "]")
		case len(m.key) > 0 && strings.IndexFunc(string(m.key), func(r rune) bool {
			return !(r == '_' || r == '-' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9')
		}) < 0:
			b.WriteString("." + string(m.key))
		default:
			b.WriteString("[" + strconv.Quote(string(m.key)) + "]")
		}
	}
	return api.Invalid(b.String(), format, args...)
}

func (c *jsonbChecker) space() {
	for c.pos < len(c.raw) {
		switch c.raw[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *jsonbChecker) value(depth int) error {
	c.space()
	if c.pos >= len(c.raw) {
		return c.invalid("not valid JSON")
	}
	switch b := c.raw[c.pos]; {
	case b == '{' || b == '[':
		if depth >= MaxJSONDepth {
			return c.invalid("nested deeper than %d levels", MaxJSONDepth)
		}
		return c.container(b, depth+1)
	case b == '"':
		_, err := c.str("")
		return err
	case b == '-' || '0' <= b && b <= '9':
		return c.number()
	default: // true, false, null
		for c.pos < len(c.raw) && 'a' <= c.raw[c.pos] && c.raw[c.pos] <= 'z' {
			c.pos++
		}
		return nil
	}
}

// container walks an object or an array, its opening byte open.
func (c *jsonbChecker) container(open byte, depth int) error {
	c.pos++
	closing := byte(']')
	if open == '{' {
		closing = '}'
	}
	for i := 0; ; i++ {
		c.space()
		if c.pos >= len(c.raw) {
			return c.invalid("not valid JSON")
		}
		switch c.raw[c.pos] {
		case closing:
			c.pos++
			return nil
		case ',':
			c.pos++
			c.space()
		}
		m := member{index: i}
		if open == '{' {
			key, err := c.str(" (an object key)")
			if err != nil {
				return err
			}
			m.key = key
			c.space()
			if c.pos < len(c.raw) && c.raw[c.pos] == ':' {
				c.pos++
			}
		}
		c.path = append(c.path, m)
		if err := c.value(depth); err != nil {
			return err
		}
		c.path = c.path[:len(c.path)-1]
	}
}

// str walks a string and returns its text (escapes left as they are,
// enough to name a key), never nil; what says what the string is, for
// errors.
func (c *jsonbChecker) str(what string) ([]byte, error) {
	c.pos++ // the opening quote
	start := c.pos
	for c.pos < len(c.raw) {
		switch c.raw[c.pos] {
		case '"':
			s := c.raw[start:c.pos:c.pos]
			c.pos++
			return s, nil
		case '\\':
			if c.pos+1 < len(c.raw) && c.raw[c.pos+1] == 'u' {
				r, ok := c.hex(c.pos + 2)
				if !ok {
					return nil, c.invalid("not valid JSON")
				}
				switch {
				case r == 0:
					return nil, c.invalid("contains a NUL character (\\u0000)%s", what)
				case utf16.IsSurrogate(r):
					low, ok := rune(0), false
					if r < 0xdc00 && c.pos+11 < len(c.raw) && c.raw[c.pos+6] == '\\' && c.raw[c.pos+7] == 'u' {
						low, ok = c.hex(c.pos + 8)
					}
					if !ok || low < 0xdc00 || low > 0xdfff {
						return nil, c.invalid("contains the lone UTF-16 surrogate \\u%04x%s: a surrogate escape must pair a high one (\\ud800-\\udbff) with a low one (\\udc00-\\udfff)", r, what)
					}
					c.pos += 6 // the pair's first half
				}
				c.pos += 6
				continue
			}
			c.pos += 2
		default:
			c.pos++
		}
	}
	return nil, c.invalid("not valid JSON")
}

// hex reads the 4 hex digits at i.
func (c *jsonbChecker) hex(i int) (rune, bool) {
	if i+4 > len(c.raw) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(c.raw[i:i+4]), 16, 32)
	return rune(n), err == nil
}

// number walks a number and checks that numeric holds it: its integer
// digits (significant ones, moved by the exponent) and its scale (the
// fraction's digits, moved by the exponent) within numeric's limits.
func (c *jsonbChecker) number() error {
	start := c.pos
	if c.raw[c.pos] == '-' {
		c.pos++
	}
	digits := func() int {
		n := 0
		for c.pos < len(c.raw) && '0' <= c.raw[c.pos] && c.raw[c.pos] <= '9' {
			c.pos++
			n++
		}
		return n
	}
	intStart := c.pos
	intLen := digits()
	intPart := string(c.raw[intStart : intStart+intLen])
	frac := ""
	if c.pos < len(c.raw) && c.raw[c.pos] == '.' {
		c.pos++
		fs := c.pos
		frac = string(c.raw[fs : fs+digits()])
	}
	exp := int64(0)
	if c.pos < len(c.raw) && (c.raw[c.pos] == 'e' || c.raw[c.pos] == 'E') {
		c.pos++
		es := c.pos
		if c.pos < len(c.raw) && (c.raw[c.pos] == '+' || c.raw[c.pos] == '-') {
			c.pos++
		}
		digits()
		var err error
		if exp, err = strconv.ParseInt(string(c.raw[es:c.pos]), 10, 64); err != nil {
			exp = 1 << 40 // beyond any limit, its sign below
			if c.raw[es] == '-' {
				exp = -exp
			}
		}
	}
	text := string(c.raw[start:c.pos])
	if len(text) > 40 {
		text = text[:37] + "..."
	}
	if exp >= maxNumericExponent || exp <= -maxNumericExponent {
		return c.invalid("the number %s has an exponent beyond ±%d", text, maxNumericExponent-1)
	}
	if scale := int64(len(frac)) - exp; scale > maxNumericScale {
		return c.invalid("the number %s has more than %d digits after the decimal point", text, maxNumericScale)
	}
	// The integer digits: the significant digits before the point, or
	// none when the value is below 1, moved by the exponent.
	sig := strings.TrimLeft(intPart, "0")
	intDigits := int64(len(sig)) + exp
	if sig == "" {
		// 0.000123e10: the first significant digit of the fraction.
		f := strings.TrimLeft(frac, "0")
		if f == "" {
			return nil // zero, whatever its exponent
		}
		intDigits = exp - int64(len(frac)-len(f)) // digits before the point of 0.f * 10^(exp-zeros)
	}
	if intDigits > maxNumericIntegerDigits {
		return c.invalid("the number %s has more than %d digits before the decimal point", text, maxNumericIntegerDigits)
	}
	return nil
}

// storableError returns te as PostgreSQL's jsonb stores it: itself when it
// is, else a copy whose code and message have their NUL characters
// replaced by U+FFFD and whose properties, if jsonb still refuses them,
// are dropped (the message says why). A run's error must be recorded
// whatever it holds; refused, it would fail the finish of its run again
// at every attempt.
func storableError(te *api.TaskError) *api.TaskError {
	raw, err := json.Marshal(te)
	if err == nil && CheckJSONB("error", raw) == nil {
		return te
	}
	out := *te
	out.Code = strings.ReplaceAll(out.Code, "\x00", "\uFFFD")
	out.Message = strings.ReplaceAll(out.Message, "\x00", "\uFFFD")
	if out.Properties != nil {
		raw, err := json.Marshal(out.Properties)
		if err == nil {
			err = CheckJSONB("properties", raw)
		}
		if err != nil {
			out.Properties = nil
			out.Message += " (its properties were dropped: " + strings.ReplaceAll(err.Error(), "\x00", "\uFFFD") + ")"
		}
	}
	return &out
}
