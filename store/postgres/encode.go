package postgres

import (
	"bytes"
	"database/sql/driver"
	"encoding/binary"
	"encoding/json"
	"slices"
	"strings"
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

// The arrays above also encode themselves in PostgreSQL's binary array
// format in one piece, for the array codecs that registerArrayCodecs
// installs on the store's connections. pgx's own array codec appends each
// element through an encode plan of its own, and its buffer, shrunk after
// every statement, doubled again for every batch statement: that showed
// in CPU profiles. Elsewhere (a connection without the codecs, the simple
// protocol) the arrays are encoded by pgx as before.

// binaryArray is an array parameter that encodes itself.
type binaryArray interface {
	// elementOID is the type of its elements.
	elementOID() uint32
	// appendBinary appends the array in the binary format, or returns nil
	// for a NULL array.
	appendBinary(buf []byte) []byte
	// binaryLen is how many bytes appendBinary appends.
	binaryLen() int
	// Value is what pgx encodes where the codecs are not used.
	Value() (driver.Value, error)
}

// leading is the first parameter of a statement whose other parameters are
// arrays too: it grows pgx's parameter buffer, where the parameters are
// appended one after the other, once for them all (total bytes), not once
// per array.
type leading struct {
	binaryArray
	total int
}

// lead returns first as a leading parameter, the buffer grown for the
// arrays of the statement, first included.
func lead(first binaryArray, all ...binaryArray) leading {
	total := 0
	for _, a := range all {
		total += a.binaryLen()
	}
	return leading{binaryArray: first, total: total}
}

func (l leading) appendBinary(buf []byte) []byte {
	return l.binaryArray.appendBinary(slices.Grow(buf, l.total))
}

func (a textArray) elementOID() uint32 { return pgtype.TextOID }
func (a textArray) binaryLen() int {
	size := arrayHeaderLen
	for _, s := range a {
		size += 4 + len(s)
	}
	return size
}
func (a textArray) appendBinary(buf []byte) []byte {
	if a == nil {
		return nil
	}
	buf = appendArrayHeader(slices.Grow(buf, a.binaryLen()), pgtype.TextOID, len(a), false)
	for _, s := range a {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)))
		buf = append(buf, s...)
	}
	return buf
}

func (a nullTextArray) elementOID() uint32 { return pgtype.TextOID }
func (a nullTextArray) binaryLen() int {
	size := arrayHeaderLen
	for _, t := range a {
		size += 4 + len(t.String)
	}
	return size
}
func (a nullTextArray) appendBinary(buf []byte) []byte {
	if a == nil {
		return nil
	}
	nulls := slices.ContainsFunc(a, func(t pgtype.Text) bool { return !t.Valid })
	buf = appendArrayHeader(slices.Grow(buf, a.binaryLen()), pgtype.TextOID, len(a), nulls)
	for _, t := range a {
		if !t.Valid {
			buf = binary.BigEndian.AppendUint32(buf, nullLen)
			continue
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(t.String)))
		buf = append(buf, t.String...)
	}
	return buf
}

func (a uuidArray) elementOID() uint32 { return pgtype.UUIDOID }
func (a uuidArray) binaryLen() int {
	size := arrayHeaderLen
	for _, u := range a {
		size += 4
		if u.Valid {
			size += 16
		}
	}
	return size
}
func (a uuidArray) appendBinary(buf []byte) []byte {
	if a == nil {
		return nil
	}
	nulls := slices.ContainsFunc(a, func(u pgtype.UUID) bool { return !u.Valid })
	buf = appendArrayHeader(slices.Grow(buf, a.binaryLen()), pgtype.UUIDOID, len(a), nulls)
	for _, u := range a {
		if !u.Valid {
			buf = binary.BigEndian.AppendUint32(buf, nullLen)
			continue
		}
		buf = binary.BigEndian.AppendUint32(buf, 16)
		buf = append(buf, u.Bytes[:]...)
	}
	return buf
}

func (a intArray) elementOID() uint32 { return pgtype.Int8OID }
func (a intArray) binaryLen() int     { return arrayHeaderLen + len(a)*12 }
func (a intArray) appendBinary(buf []byte) []byte {
	return appendFixed(buf, a, pgtype.Int8OID, 8, func(b []byte, v int64) []byte {
		return binary.BigEndian.AppendUint64(b, uint64(v))
	})
}

func (a boolArray) elementOID() uint32 { return pgtype.BoolOID }
func (a boolArray) binaryLen() int     { return arrayHeaderLen + len(a)*5 }
func (a boolArray) appendBinary(buf []byte) []byte {
	return appendFixed(buf, a, pgtype.BoolOID, 1, func(b []byte, v bool) []byte {
		if v {
			return append(b, 1)
		}
		return append(b, 0)
	})
}

// appendFixed appends a, an array without NULLs of elements of type elem,
// each size bytes long as put writes it; nil is a NULL array.
func appendFixed[T any](buf []byte, a []T, elem uint32, size int, put func([]byte, T) []byte) []byte {
	if a == nil {
		return nil
	}
	buf = appendArrayHeader(slices.Grow(buf, arrayHeaderLen+len(a)*(4+size)), elem, len(a), false)
	for _, v := range a {
		buf = put(binary.BigEndian.AppendUint32(buf, uint32(size)), v)
	}
	return buf
}

// arrayHeaderLen is the length of the header of a one-dimensional array:
// dimensions, null flag, element type, length and lower bound.
const arrayHeaderLen = 20

// nullLen is the length that stands for a NULL element (-1).
const nullLen = 0xFFFFFFFF

// appendArrayHeader appends the header of a one-dimensional array of n
// elements of type elem, starting at 1.
func appendArrayHeader(buf []byte, elem uint32, n int, nulls bool) []byte {
	buf = binary.BigEndian.AppendUint32(buf, 1)
	flag := uint32(0)
	if nulls {
		flag = 1
	}
	buf = binary.BigEndian.AppendUint32(buf, flag)
	buf = binary.BigEndian.AppendUint32(buf, elem)
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	return binary.BigEndian.AppendUint32(buf, 1)
}

// arrayCodec is pgx's codec of an array type that encodes the
// binaryArray parameters of its element type itself, in binary.
type arrayCodec struct {
	*pgtype.ArrayCodec
	elem uint32
}

func (c *arrayCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if a, ok := value.(binaryArray); ok && format == pgtype.BinaryFormatCode && a.elementOID() == c.elem {
		return binaryArrayPlan{}
	}
	return c.ArrayCodec.PlanEncode(m, oid, format, value)
}

// binaryArrayPlan encodes a binaryArray.
type binaryArrayPlan struct{}

func (binaryArrayPlan) Encode(value any, buf []byte) ([]byte, error) {
	return value.(binaryArray).appendBinary(buf), nil
}

// registerArrayCodecs installs the array codecs that encode the
// binaryArray parameters on a connection's type map.
func registerArrayCodecs(m *pgtype.Map) {
	for _, a := range [...]struct{ oid, elem uint32 }{
		{pgtype.TextArrayOID, pgtype.TextOID},
		{pgtype.UUIDArrayOID, pgtype.UUIDOID},
		{pgtype.Int8ArrayOID, pgtype.Int8OID},
		{pgtype.BoolArrayOID, pgtype.BoolOID},
	} {
		t, ok := m.TypeForOID(a.oid)
		if !ok {
			continue
		}
		if ac, ok := t.Codec.(*pgtype.ArrayCodec); ok && ac.ElementType.OID == a.elem {
			m.RegisterType(&pgtype.Type{Name: t.Name, OID: t.OID, Codec: &arrayCodec{ArrayCodec: ac, elem: a.elem}})
		}
	}
}

// unnestRows returns a subquery, named alias, that makes a row of the
// i-th elements of array parameters, one column each. A column is given
// as its name and the parameter, as in "id $1::text[]"; a column whose
// parameter is "ordinality" numbers the rows from 1 (the first column's
// array's subscripts).
//
// The arrays are unnested by set-returning functions in the subquery's
// select list, which run in step and hand on each row as it is made,
// rather than by unnest(a, b, ...) in FROM: that is a function scan,
// which first copies every row into a tuplestore, spilled to disk once
// past work_mem. A workflow's 10,000 nodes (18 arrays) took 35 ms that
// way against 4 ms so. Arrays of unequal length give NULLs past the end
// of the shorter ones either way.
func unnestRows(alias string, cols ...string) string {
	var b strings.Builder
	b.WriteString("(SELECT ")
	var first string
	for i, col := range cols {
		name, param, _ := strings.Cut(col, " ")
		if i == 0 {
			first = param
		} else {
			b.WriteString(", ")
		}
		if param == "ordinality" {
			b.WriteString("generate_subscripts(" + first + ", 1)")
		} else {
			b.WriteString("unnest(" + param + ")")
		}
		b.WriteString(" AS " + name)
	}
	b.WriteString(") " + alias)
	return b.String()
}
