package cleanup

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// slowStore deletes nothing, taking a while for each statement.
type slowStore struct{ took time.Duration }

func (s slowStore) DeleteFinished(ctx context.Context, _ store.DeleteFinishedParams) (int, error) {
	return 0, spi.Sleep(ctx, s.took)
}

func (s slowStore) DeleteExpired(ctx context.Context, _ int) (map[string]int, error) {
	return nil, spi.Sleep(ctx, s.took)
}

// TestTheNextRunIsAnIntervalAfterTheLastBegan: the next run is due an
// interval after the start of the last, not after its end, so that a
// long run (a large backlog under load) does not stretch the time a
// finished task is kept past its retention; a run longer than the
// interval is followed by the next at once.
func TestTheNextRunIsAnIntervalAfterTheLastBegan(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		took, want time.Duration
	}{
		{0, 5 * time.Minute},
		{40 * time.Second, 4*time.Minute + 20*time.Second},
		{5 * time.Minute, 0},
		{6 * time.Minute, 0},
	} {
		delay, again := New(slowStore{}, spi.NewRegistry(), Config{}).RescheduleAfterSuccess(Params{}, Result{Took: tc.took})
		require.True(t, again)
		require.Equal(t, tc.want, delay, "a run that took %s", tc.took)
	}

	// Through a run: the time it took counts.
	c := New(slowStore{took: 100 * time.Millisecond}, spi.NewRegistry(), Config{Interval: time.Second})
	res, err := c.Run(context.Background(), nil, Params{})
	require.NoError(t, err)
	delay, _ := c.RescheduleAfterSuccess(Params{}, res)
	require.Equal(t, time.Second-res.Took, delay)
	require.LessOrEqual(t, delay, 900*time.Millisecond)
}
