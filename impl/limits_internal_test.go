package impl

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// TestCheckRateUsesLooksALimitUpOnce: a cached limit that expires while a
// submit checks its tasks is not refused as missing. Each lookup of the
// cache here is 600 ms after the one before, against a time to live of a
// second: a second lookup of the same limit would find it expired.
func TestCheckRateUsesLooksALimitUpOnce(t *testing.T) {
	t.Parallel()
	at := time.Now()
	c := &Client{}
	c.rates.now = func() time.Time { at = at.Add(600 * time.Millisecond); return at }
	limit := api.RateLimit{Name: "api", Limit: 10, Period: time.Second}
	c.rates.put(limit)
	reg := &spi.Registration{ID: "b"}
	tasks := []store.NewTask{
		{ID: "t1", RateUses: []store.RateUse{{Limit: "api", Key: "a", Units: 1}}},
		{ID: "t2", RateUses: []store.RateUse{{Limit: "api", Key: "b", Units: 2}}},
	}
	require.NoError(t, c.checkRateUses(context.Background(), tasks, []*spi.Registration{reg, reg}))

	c.rates.put(limit)
	tasks[1].RateUses[0].Units = 11
	err := c.checkRateUses(context.Background(), tasks, []*spi.Registration{reg, reg})
	require.ErrorIs(t, err, api.ErrInvalid)
	require.ErrorContains(t, err, "task t2")
	require.ErrorContains(t, err, "11 is over the limit")
}
