package spi

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/google/uuid"

	"github.com/stinthq/stint/api"
)

// IDs makes task ids for one behavior.
type IDs struct {
	behavior api.BehaviorID
	// made, when set, receives the last id Unique made, so that the
	// registry can tell a new id from one that may name a stored task.
	made *api.TaskID
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
	id := api.TaskID(newV7())
	if g.made != nil {
		*g.made = id
	}
	return id
}

// v7 makes UUIDv7s as github.com/google/uuid's NewV7 does: 48 bits of Unix
// milliseconds, 12 bits of sub-millisecond sequence that keep the ids of a
// process strictly ordered, and 62 random bits. The random bits come from
// a buffer of crypto/rand output filled for many ids at once: a read per
// id (as NewV7 does) was a system call and an allocation per task. The
// text of the ids is written into chunks of a few ids, one allocation per
// chunk instead of one per id; a chunk stays in memory as long as any of
// its ids does, so chunks stay small.
var v7 struct {
	sync.Mutex
	last int64             // the time and sequence of the last id
	rand [v7Batch * 8]byte // random bytes, 8 per id
	next int               // offset of the first unused bytes of rand
	text []byte            // the current chunk: its free capacity takes the next ids
}

const (
	v7Batch = 256 // ids whose random bytes are read at once
	v7Chunk = 16  // ids whose text shares an allocation
)

// newV7 returns the text of a new UUIDv7.
func newV7() string {
	var u uuid.UUID
	v7.Lock()
	defer v7.Unlock()
	nano := time.Now().UnixNano()
	milli := nano / int64(time.Millisecond)
	seq := (nano - milli*int64(time.Millisecond)) >> 8 // 0 to 3906
	now := milli<<12 + seq
	if now <= v7.last {
		now = v7.last + 1
	}
	v7.last = now
	if v7.next == 0 {
		// Never fails; it crashes the program if it cannot read.
		_, _ = rand.Read(v7.rand[:])
	}
	copy(u[8:], v7.rand[v7.next:v7.next+8])
	clear(v7.rand[v7.next : v7.next+8]) // used bytes do not stay in memory
	v7.next = (v7.next + 8) % len(v7.rand)
	milli, seq = now>>12, now&0xfff
	u[0], u[1], u[2], u[3], u[4], u[5] = byte(milli>>40), byte(milli>>32), byte(milli>>24), byte(milli>>16), byte(milli>>8), byte(milli)
	u[6], u[7] = 0x70|byte(seq>>8)&0x0f, byte(seq)
	u[8] = u[8]&0x3f | 0x80 // the RFC 9562 variant
	if cap(v7.text)-len(v7.text) < uuidLen {
		v7.text = make([]byte, 0, v7Chunk*uuidLen)
	}
	// Each id's bytes are written once, before its string is made, and
	// never after.
	start := len(v7.text)
	v7.text = appendUUID(v7.text, u)
	return unsafe.String(&v7.text[start], uuidLen)
}

// uuidLen is the length of a UUID's text.
const uuidLen = 36

// appendUUID appends the text of u (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx).
func appendUUID(dst []byte, u uuid.UUID) []byte {
	dst = hex.AppendEncode(dst, u[0:4])
	dst = append(dst, '-')
	dst = hex.AppendEncode(dst, u[4:6])
	dst = append(dst, '-')
	dst = hex.AppendEncode(dst, u[6:8])
	dst = append(dst, '-')
	dst = hex.AppendEncode(dst, u[8:10])
	dst = append(dst, '-')
	return hex.AppendEncode(dst, u[10:16])
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
