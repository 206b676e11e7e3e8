package impl

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRepeated(t *testing.T) {
	t.Parallel()
	long := make([]string, 100)
	for i := range long {
		long[i] = fmt.Sprintf("n%d", i)
	}
	cases := map[string]struct {
		names []string
		want  string
	}{
		"none":                   {nil, ""},
		"short, no repeat":       {[]string{"a", "b", "c"}, ""},
		"short, a repeat":        {[]string{"a", "b", "a", "b"}, "a"},
		"long, no repeat":        {long, ""},
		"long, a repeat at last": {append(long[:len(long):len(long)], "n7"), "n7"},
	}
	for name, tc := range cases {
		got, ok := repeated(tc.names)
		require.Equal(t, tc.want, got, name)
		require.Equal(t, tc.want != "", ok, name)
	}
}
