package web

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"
)

// Role is what a token may do. Each role may do everything the roles below
// it may: read < submit < admin.
type Role int

// The roles, weakest first.
const (
	// RoleNone is no role: an unknown or missing token.
	RoleNone Role = iota
	// RoleRead lists and inspects tasks, nodes and statistics, and follows
	// the event stream.
	RoleRead
	// RoleSubmit also submits tasks.
	RoleSubmit
	// RoleAdmin also holds, releases, retries and removes tasks, holds and
	// releases groups, and pauses and resumes behaviors.
	RoleAdmin
)

// String returns the role's name as tokens are written: read, submit or
// admin.
func (r Role) String() string {
	switch r {
	case RoleRead:
		return "read"
	case RoleSubmit:
		return "submit"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

// ParseRole returns the role named s: read, submit or admin.
func ParseRole(s string) (Role, error) {
	switch s {
	case "read":
		return RoleRead, nil
	case "submit":
		return RoleSubmit, nil
	case "admin":
		return RoleAdmin, nil
	}
	return RoleNone, fmt.Errorf("unknown role %q: want read, submit or admin", s)
}

// MinTokenLength is the shortest token accepted, in bytes: a token is a
// password that is sent with every request, so it must not be guessable.
const MinTokenLength = 16

// Tokens is the set of bearer tokens the API accepts, each with its role.
// Only the SHA-256 hash of each token is kept in memory. The zero value is
// an empty set; build it with Add or AddText before serving, as it is not
// safe for concurrent modification.
type Tokens struct {
	entries []tokenEntry
}

type tokenEntry struct {
	hash [sha256.Size]byte
	role Role
}

// Len returns the number of tokens.
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	return len(t.entries)
}

// Add accepts token for role. A token must be at least MinTokenLength
// printable, non-space ASCII characters, and may be given only once.
func (t *Tokens) Add(role Role, token string) error {
	if role < RoleRead || role > RoleAdmin {
		return fmt.Errorf("add token: unknown role %d", role)
	}
	if len(token) < MinTokenLength {
		return fmt.Errorf("%s token is %d characters: tokens must be at least %d", role, len(token), MinTokenLength)
	}
	for _, c := range []byte(token) {
		if c <= ' ' || c >= 0x7f {
			return fmt.Errorf("%s token has a space, control or non-ASCII character: tokens are printable ASCII", role)
		}
	}
	h := sha256.Sum256([]byte(token))
	if _, ok := t.lookupHash(h); ok {
		return fmt.Errorf("a %s token is given twice, or for two roles", role)
	}
	t.entries = append(t.entries, tokenEntry{hash: h, role: role})
	return nil
}

// AddText adds the tokens in text: entries of the form ROLE:TOKEN
// separated by newlines, commas or spaces. Blank lines and lines starting
// with # are skipped. source names where the text came from, for errors,
// which never contain the token itself.
func (t *Tokens) AddText(source, text string) error {
	sc := bufio.NewScanner(strings.NewReader(text))
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		for _, entry := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' }) {
			name, token, ok := strings.Cut(entry, ":")
			if !ok {
				return fmt.Errorf("%s, line %d: want ROLE:TOKEN, with ROLE read, submit or admin", source, line)
			}
			role, err := ParseRole(name)
			if err != nil {
				return fmt.Errorf("%s, line %d: %w", source, line, err)
			}
			if err := t.Add(role, token); err != nil {
				return fmt.Errorf("%s, line %d: %w", source, line, err)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", source, err)
	}
	return nil
}

// Lookup returns the role of token, or RoleNone. It compares the token's
// hash with every known hash in constant time, so neither the time taken
// nor an early exit tells how much of a guess was right.
func (t *Tokens) Lookup(token string) Role {
	if t == nil || token == "" {
		return RoleNone
	}
	role, _ := t.lookupHash(sha256.Sum256([]byte(token)))
	return role
}

func (t *Tokens) lookupHash(h [sha256.Size]byte) (Role, bool) {
	found := RoleNone
	for _, e := range t.entries {
		if subtle.ConstantTimeCompare(h[:], e.hash[:]) == 1 {
			found = e.role
		}
	}
	return found, found != RoleNone
}

// bearerToken returns the token of an "Authorization: Bearer TOKEN"
// header, or "".
func bearerToken(r *http.Request) string {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}
