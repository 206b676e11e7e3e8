package spi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/stinthq/stint/api"
)

// IDs makes task ids for one behavior.
type IDs struct {
	behavior api.BehaviorID
}

// NewIDs returns the id maker of behavior b.
func NewIDs(b api.BehaviorID) IDs { return IDs{behavior: b} }

// Deterministic returns an id that depends only on the behavior and parts:
// the behavior id, a colon and 32 hex digits of the SHA-256 of the parts.
// Submissions with equal parts share one task.
func (g IDs) Deterministic(parts ...any) api.TaskID {
	h := sha256.New()
	fmt.Fprintf(h, "%s", g.behavior)
	for _, p := range parts {
		// Length-prefixed so that ("ab","c") and ("a","bc") differ.
		s := fmt.Sprint(p)
		fmt.Fprintf(h, "\x00%d:%s", len(s), s)
	}
	return api.TaskID(string(g.behavior) + ":" + hex.EncodeToString(h.Sum(nil))[:32])
}

// Unique returns a new random, time-ordered id (a UUIDv7).
func (g IDs) Unique() api.TaskID {
	return api.TaskID(uuid.Must(uuid.NewV7()).String())
}

// CheckTaskID returns an *api.InvalidError when id is not 3 to 128
// characters from [A-Za-z0-9._:/@+=-].
func CheckTaskID(field string, id api.TaskID) error {
	ok := len(id) >= 3 && len(id) <= 128
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._:/@+=-", c) >= 0
	}
	if !ok {
		return api.Invalid(field, "%q must be 3 to 128 characters from A-Z a-z 0-9 . _ : / @ + = -", truncate(string(id)))
	}
	return nil
}

// CheckBehaviorID returns an *api.InvalidError when id is not 3 to 64
// characters from [a-z0-9._-] starting with a letter.
func CheckBehaviorID(id api.BehaviorID) error {
	ok := len(id) >= 3 && len(id) <= 64 && 'a' <= id[0] && id[0] <= 'z'
	for i := 1; ok && i < len(id); i++ {
		c := id[i]
		ok = 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
	}
	if !ok {
		return api.Invalid("behavior", "%q must be 3 to 64 characters from a-z 0-9 . _ - starting with a letter", truncate(string(id)))
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
