package impl

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

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
