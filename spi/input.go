package spi

import (
	"time"
	"unicode/utf8"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/timefmt"
)

// Limits of the free-text inputs of a task.
const (
	// MaxGroupKey is the longest group key, in bytes.
	MaxGroupKey = 256
	// MaxTrace is the longest traceparent, in bytes.
	MaxTrace = 256
)

// CheckGroupKey checks a group key named by field: 1 to MaxGroupKey
// printable UTF-8 bytes. The engine, the CLI and the HTTP API all check
// group keys with it, so they accept the same keys.
func CheckGroupKey(field, key string) error {
	if key == "" || len(key) > MaxGroupKey || !Printable(key) {
		return api.Invalid(field, "must be 1 to %d printable UTF-8 bytes", MaxGroupKey)
	}
	return nil
}

// MaxRateLimitName is the longest name of a rate limit, in bytes.
const MaxRateLimitName = 128

// CheckRateLimitName checks the name of a rate limit: 1 to
// MaxRateLimitName printable UTF-8 bytes.
func CheckRateLimitName(field, name string) error {
	if name == "" || len(name) > MaxRateLimitName || !Printable(name) {
		return api.Invalid(field, "must be 1 to %d printable UTF-8 bytes", MaxRateLimitName)
	}
	return nil
}

// MaxRatePeriod is the longest period of a rate limit.
const MaxRatePeriod = 366 * 24 * time.Hour

// CheckRateLimit checks a rate limit: its name (CheckRateLimitName), a
// Limit of at least 1, and a Period of whole microseconds from 1
// millisecond to MaxRatePeriod. Errors are *api.InvalidError.
func CheckRateLimit(l api.RateLimit) error {
	if err := CheckRateLimitName("name", l.Name); err != nil {
		return err
	}
	if l.Limit < 1 {
		return api.Invalid("limit", "%d is not positive", l.Limit)
	}
	if l.Period < time.Millisecond || l.Period > MaxRatePeriod {
		return api.Invalid("period", "must be from 1ms to %s, not %s", timefmt.Duration(MaxRatePeriod), timefmt.Duration(l.Period))
	}
	if l.Period%time.Microsecond != 0 {
		return api.Invalid("period", "%s is not a whole number of microseconds", timefmt.Duration(l.Period))
	}
	return nil
}

// CheckConcurrencyLimit checks a cap: a well-formed behavior id; on a key
// (at most spi.MaxGroupKey printable bytes), a Max of zero (the policy's
// cap kept) or more and a Weight of zero (1) or more, not both zero; on the
// behavior as a whole, a Max of at least 1 and no Weight. Errors are
// *api.InvalidError.
func CheckConcurrencyLimit(l api.ConcurrencyLimit) error {
	if err := CheckBehaviorID(l.Behavior); err != nil {
		return err
	}
	if l.Max < 0 {
		return api.Invalid("max", "%d is negative", l.Max)
	}
	if l.Weight < 0 {
		return api.Invalid("weight", "%d is negative", l.Weight)
	}
	if l.Key == "" {
		if l.Max < 1 {
			return api.Invalid("max", "a cap of the behavior as a whole must be at least 1, not %d", l.Max)
		}
		if l.Weight != 0 {
			return api.Invalid("weight", "applies to a group key, not to the behavior as a whole")
		}
		return nil
	}
	if err := CheckGroupKey("key", l.Key); err != nil {
		return err
	}
	if l.Max == 0 && l.Weight == 0 {
		return api.Invalid("max", "zero with no weight sets nothing")
	}
	return nil
}

// CheckTrace checks a W3C traceparent: empty, or up to MaxTrace printable
// UTF-8 bytes.
func CheckTrace(trace string) error {
	if len(trace) > MaxTrace || !Printable(trace) {
		return api.Invalid("trace", "must be at most %d printable UTF-8 bytes", MaxTrace)
	}
	return nil
}

// Printable reports whether s is valid UTF-8 without control characters.
func Printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}
