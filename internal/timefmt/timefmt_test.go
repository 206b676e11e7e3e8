package timefmt

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDurationReadsAsAPersonWouldWriteIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{500 * time.Millisecond, "500ms"},
		{1500 * time.Millisecond, "1.5s"},
		{time.Minute, "1m"},
		{90 * time.Minute, "1h30m"},
		{time.Hour, "1h"},
		{time.Hour + time.Second, "1h0m1s"},
		{24 * time.Hour, "1 day"},
		{366 * 24 * time.Hour, "366 days"},
		{54 * time.Hour, "2 days 6h"},
		{9000 * time.Hour, "375 days"},
		{-time.Minute, "-1m"},
	} {
		require.Equal(t, tc.want, Duration(tc.d), "%d", tc.d)
	}
}
