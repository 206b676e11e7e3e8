package chaos

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseLSN(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want uint64
		bad  bool
	}{
		{in: "0/0", want: 0},
		{in: "16/B374D848", want: 0x16_B374D848},
		{in: "FFFFFFFF/FFFFFFFF", want: ^uint64(0)},
		{in: "16B374D848", bad: true},
		{in: "x/1", bad: true},
		{in: "1/100000000", bad: true},
	} {
		got, err := ParseLSN(c.in)
		if c.bad {
			require.Error(t, err, c.in)
			continue
		}
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, got, c.in)
	}
}
