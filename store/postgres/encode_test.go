package postgres

import (
	"fmt"
	"strings"
	"testing"
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
