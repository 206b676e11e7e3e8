package impl

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// TestACompletionBatchHoldsBoundedBytes: one statement records no more
// than maxCompletionBytes of results (a result bigger than that goes
// alone), where it took every completion pending: 200 results of a
// megabyte outran the statement's deadline each time it was tried.
func TestACompletionBatchHoldsBoundedBytes(t *testing.T) {
	t.Parallel()
	c := newCompleter(nil, nil, nil, nil)
	result := func(size int) *run { return &run{end: store.Completion{Result: make(json.RawMessage, size)}} }
	for range 40 {
		c.finish(result(1 << 20))
	}
	c.finish(result(maxCompletionBytes + 1))
	c.finish(result(1 << 20))
	var sizes []int
	for batch := c.take(nil); len(batch) > 0; batch = c.take(batch) {
		sizes = append(sizes, len(batch))
	}
	require.Equal(t, []int{16, 16, 8, 1, 1}, sizes)
}

// TestACompletionBatchIsInIDOrder: a batch goes to the store in task id
// order, whatever order its runs ended in, so that its finish locks the
// rows in the order other writers of many tasks lock them.
func TestACompletionBatchIsInIDOrder(t *testing.T) {
	t.Parallel()
	c := newCompleter(nil, nil, nil, nil)
	for _, id := range []api.TaskID{"t-3", "t-10", "t-1", "T-2", "t-2"} {
		c.finish(&run{claimed: store.Claimed{LeaseRef: store.LeaseRef{ID: id}}})
	}
	var ids []api.TaskID
	for _, r := range c.take(nil) {
		ids = append(ids, r.claimed.ID)
	}
	require.Equal(t, []api.TaskID{"T-2", "t-1", "t-10", "t-2", "t-3"}, ids)
}
