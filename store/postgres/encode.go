package postgres

import (
	"bytes"
	"database/sql/driver"
	"encoding/json"
	"unsafe"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stinthq/stint/api"
)

// Array parameters of the batch statements. pgx encodes a plain slice
// element by element through an interface, and putting a string, a UUID
// or an int64 in an interface allocates: one allocation per element per
// statement. These types hand pgx a pointer to each element instead,
// which an interface holds without allocating, with the valuer method
// pgx's codecs encode directly. Where the parameter's type is unknown
// (the simple protocol, as behind PgBouncer), Value hands pgx the plain
// slice it encodes by itself.

// textArray is a text[] parameter.
type textArray []string

// textElem is an element of a textArray.
type textElem string

func (e *textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*e), Valid: true}, nil
}

func (a textArray) Dimensions() []pgtype.ArrayDimension { return dimensions(a == nil, len(a)) }
func (a textArray) Index(i int) any                     { return (*textElem)(&a[i]) }
func (a textArray) IndexType() any                      { return new(textElem) }
func (a textArray) Value() (driver.Value, error)        { return []string(a), nil }

// nullTextArray is a text[] parameter with NULL elements.
type nullTextArray []pgtype.Text

func (a nullTextArray) Dimensions() []pgtype.ArrayDimension { return dimensions(a == nil, len(a)) }
func (a nullTextArray) Index(i int) any                     { return &a[i] }
func (a nullTextArray) IndexType() any                      { return new(pgtype.Text) }
func (a nullTextArray) Value() (driver.Value, error)        { return []pgtype.Text(a), nil }

// uuidArray is a uuid[] parameter.
type uuidArray []pgtype.UUID

func (a uuidArray) Dimensions() []pgtype.ArrayDimension { return dimensions(a == nil, len(a)) }
func (a uuidArray) Index(i int) any                     { return &a[i] }
func (a uuidArray) IndexType() any                      { return new(pgtype.UUID) }
func (a uuidArray) Value() (driver.Value, error)        { return []pgtype.UUID(a), nil }

// intArray is a bigint[] or smallint[] parameter.
type intArray []int64

// intElem is an element of an intArray.
type intElem int64

func (e *intElem) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*e), Valid: true}, nil
}

func (a intArray) Dimensions() []pgtype.ArrayDimension { return dimensions(a == nil, len(a)) }
func (a intArray) Index(i int) any                     { return (*intElem)(&a[i]) }
func (a intArray) IndexType() any                      { return new(intElem) }
func (a intArray) Value() (driver.Value, error)        { return []int64(a), nil }

// boolArray is a bool[] parameter.
type boolArray []bool

// boolElem is an element of a boolArray.
type boolElem bool

func (e *boolElem) BoolValue() (pgtype.Bool, error) {
	return pgtype.Bool{Bool: bool(*e), Valid: true}, nil
}

func (a boolArray) Dimensions() []pgtype.ArrayDimension { return dimensions(a == nil, len(a)) }
func (a boolArray) Index(i int) any                     { return (*boolElem)(&a[i]) }
func (a boolArray) IndexType() any                      { return new(boolElem) }
func (a boolArray) Value() (driver.Value, error)        { return []bool(a), nil }

// dimensions returns the dimensions of a one-dimensional array of n
// elements, or none for a NULL array.
func dimensions(null bool, n int) []pgtype.ArrayDimension {
	if null {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(n), LowerBound: 1}}
}

// jsonText returns raw JSON as a text parameter without copying it: the
// parameter is encoded before the statement returns, and raw is not
// written meanwhile. The common empty object needs no conversion at all.
func jsonText(raw []byte) pgtype.Text {
	switch {
	case raw == nil:
		return pgtype.Text{}
	case string(raw) == "{}":
		return pgtype.Text{String: "{}", Valid: true}
	}
	return pgtype.Text{String: unsafeString(raw), Valid: true}
}

// unsafeString returns b as a string without copying it; b must not change
// while the string is in use.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// Rows of the batch statements are read through pgtype.DriverBytes, which
// refers to the row in the connection's buffer without copying it, so that
// the values repeated from row to row (a behavior, a status, empty params)
// need no allocation of their own.

// internStatus returns the status b names.
func internStatus(b []byte) api.Status {
	for _, s := range statuses {
		if string(b) == string(s) {
			return s
		}
	}
	return api.Status(b)
}

var statuses = []api.Status{api.StatusScheduled, api.StatusRunning, api.StatusSuccess,
	api.StatusFailure, api.StatusHeld, api.StatusRemoved}

// internBehavior returns b as one of behaviors if it is one.
func internBehavior(b []byte, behaviors []string) api.BehaviorID {
	for _, s := range behaviors {
		if string(b) == s {
			return api.BehaviorID(s)
		}
	}
	return api.BehaviorID(b)
}

// stringChunks makes strings of the short byte slices of a row's buffer
// (task ids), many to an allocation: an allocation per string showed in
// profiles. A chunk is kept in memory as long as any of its strings is, so
// chunks stay small; each string's bytes are written once, before the
// string is made, and never after.
type stringChunks struct {
	buf []byte // the current chunk: its free capacity takes the next strings
}

// stringChunk is the size of a chunk of stringChunks: some fifty ids.
const stringChunk = 2048

// string returns b as a string that does not refer to b.
func (sc *stringChunks) string(b []byte) string {
	if len(b) > cap(sc.buf)-len(sc.buf) {
		if len(b) > stringChunk/8 {
			return string(b)
		}
		sc.buf = make([]byte, 0, stringChunk)
	}
	start := len(sc.buf)
	sc.buf = append(sc.buf, b...)
	return unsafeString(sc.buf[start:])
}

// copyJSON returns a copy of JSON in a row's buffer, nil for NULL. Empty
// objects share one slice: nothing writes to params or progress.
func copyJSON(b []byte) json.RawMessage {
	switch {
	case b == nil:
		return nil
	case string(b) == "{}":
		return emptyObject
	}
	return bytes.Clone(b)
}

var emptyObject = json.RawMessage("{}")
