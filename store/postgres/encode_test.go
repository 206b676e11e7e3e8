package postgres

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
)

// TestStringChunks checks that the strings of a stringChunks keep their
// bytes while the row buffer they came from is reused and chunks fill up,
// and that long strings get allocations of their own.
func TestStringChunks(t *testing.T) {
	var sc stringChunks
	row := make([]byte, 0, 512)
	var got, want []string
	for i := range 200 {
		w := fmt.Sprintf("%08d-%s", i, strings.Repeat("x", i%40))
		if i%50 == 0 {
			w += strings.Repeat("long", 100) // past a chunk's share
		}
		row = append(row[:0], w...)
		got = append(got, sc.string(row))
		want = append(want, w)
		clear(row[:cap(row)]) // the row buffer is reused
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("string %d = %q, want %q", i, got[i], want[i])
		}
	}
}

// TestArrayCodecs checks that the array parameters encode to the same
// bytes through the codecs of registerArrayCodecs as through pgx's own,
// and that those codecs are the ones used.
func TestArrayCodecs(t *testing.T) {
	plain, fast := pgtype.NewMap(), pgtype.NewMap()
	registerArrayCodecs(fast)
	u := pgtype.UUID{Bytes: [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, Valid: true}
	cases := []struct {
		oid   uint32
		value binaryArray
	}{
		{pgtype.TextArrayOID, textArray{"a", "", "task:0123"}},
		{pgtype.TextArrayOID, textArray{}},
		{pgtype.TextArrayOID, textArray(nil)},
		{pgtype.TextArrayOID, nullTextArray{{String: `{"x":1}`, Valid: true}, {}, {String: "", Valid: true}}},
		{pgtype.TextArrayOID, nullTextArray{{String: "{}", Valid: true}}},
		{pgtype.UUIDArrayOID, uuidArray{u, {}, u}},
		{pgtype.UUIDArrayOID, uuidArray{u}},
		{pgtype.Int8ArrayOID, intArray{-1, 0, 1 << 40}},
		{pgtype.BoolArrayOID, boolArray{true, false}},
		{pgtype.TextArrayOID, lead(textArray{"a", "b"}, textArray{"a", "b"}, uuidArray{u})},
	}
	for i, c := range cases {
		want, err := plain.Encode(c.oid, pgtype.BinaryFormatCode, c.value, nil)
		if err != nil {
			t.Fatalf("case %d: pgx: %v", i, err)
		}
		got, err := fast.Encode(c.oid, pgtype.BinaryFormatCode, c.value, []byte("prefix"))
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if n := c.value.binaryLen(); want != nil && len(want) != n {
			t.Fatalf("case %d: binaryLen %d, encoded %d bytes", i, n, len(want))
		}
		if want == nil {
			if got != nil {
				t.Fatalf("case %d: got %x, want NULL", i, got)
			}
		} else if !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Fatalf("case %d: got %x, want %x", i, got, want)
		}
		if _, ok := fast.PlanEncode(c.oid, pgtype.BinaryFormatCode, c.value).(binaryArrayPlan); !ok {
			t.Fatalf("case %d: the array codec was not used", i)
		}
	}
	// Not an element type the array encodes: pgx's codec does it.
	if _, ok := fast.PlanEncode(pgtype.Int2ArrayOID, pgtype.BinaryFormatCode, intArray{1}).(binaryArrayPlan); ok {
		t.Fatal("a smallint[] parameter went to the bigint[] encoder")
	}
}

// TestUnnestRows checks that the rows of unnestRows pair the arrays'
// elements in step, pad a shorter array with NULLs, number the rows, and
// are made without a function scan (which copies them all first).
func TestUnnestRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.New(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	q := `SELECT r.id, r.n, r.ord FROM ` + unnestRows("r", "id $1::text[]", "n $2::bigint[]", "ord ordinality")
	rows, err := conn.Query(ctx, q, textArray{"x", "y", "z"}, intArray{10, 20})
	require.NoError(t, err)
	type row struct {
		ID  string
		N   *int64
		Ord int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	n := func(v int64) *int64 { return &v }
	require.Equal(t, []row{{"x", n(10), 1}, {"y", n(20), 2}, {"z", nil, 3}}, got)

	rows, err = conn.Query(ctx, "EXPLAIN "+q, textArray{"x"}, intArray{1})
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Contains(t, plan, "ProjectSet")
	require.NotContains(t, plan, "Function Scan")
}
