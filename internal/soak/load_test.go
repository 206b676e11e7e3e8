package soak

import (
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
)

// load submits the soak's mix at a fixed rate, and a workflow of four
// nodes every two seconds, each task numbered (Params.N). It remembers
// which numbers were acknowledged, for the ledger.
type load struct {
	client *impl.Client
	rate   float64 // tasks a second, workflows aside
	next   atomic.Int64

	mu    sync.Mutex
	acked []bool // by N

	// Counted as they happen, read by the sampler.
	submitted atomic.Int64 // acknowledged tasks of the mix
	nodes     atomic.Int64 // acknowledged workflow nodes
	errs      atomic.Int64 // submits that failed (not retried: a retry of a finished task would run it again)
	lastErr   atomic.Value // string
}

// inFlight caps the submits waiting for their acknowledgment.
const inFlight = 512

// request is the submit of task n of the mix: of every ten, four no-ops,
// three tasks of 20-200 ms, one that fails its first attempt and two
// no-ops under a group key (of 16, four running at most per key).
func request(n int64) api.SubmitRequest {
	p := Params{N: n, At: time.Now().UnixMicro()}
	behavior := taskKind.ID
	group := ""
	switch n % 10 {
	case 4, 5, 6:
		p.SleepMS = 20 + mrand.IntN(181)
	case 7:
		p.FailOnce = true
	case 8, 9:
		behavior, group = groupedKind.ID, fmt.Sprint("key-", n%16)
	}
	raw, _ := json.Marshal(p) // Params always encodes
	return api.SubmitRequest{Behavior: behavior, Params: raw, GroupKey: group, Retention: shortest}
}

// run submits until ctx ends: every 10 ms, as many tasks as the rate has
// made due since the start, each on its own (the client's coalescer
// batches them).
func (l *load) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, inFlight)
	start := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var issued int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		due := int64(l.rate*time.Since(start).Seconds()) - issued
		for range due {
			select {
			case <-ctx.Done():
				return
			case sem <- struct{}{}:
			}
			issued++
			n := l.next.Add(1) - 1
			wg.Go(func() {
				defer func() { <-sem }()
				if _, err := l.client.Submit(ctx, request(n)); err != nil {
					l.failed(ctx, err)
					return
				}
				l.ack(n)
				l.submitted.Add(1)
			})
		}
	}
}

// workflows submits a workflow of four nodes every two seconds until ctx
// ends: a, then b and c after a, then d after both, which reads b's
// result. Nodes and workflow have the shortest retention.
func (l *load) workflows(ctx context.Context) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		first := l.next.Add(4) - 4
		node := func(i int64, name, reads string, deps ...string) api.WorkflowNode {
			raw, _ := json.Marshal(Params{N: first + i, At: time.Now().UnixMicro(), Reads: reads}) // Params always encodes
			return api.WorkflowNode{Name: name, DependsOn: deps,
				Task: api.SubmitRequest{Behavior: nodeKind.ID, Params: raw, Retention: shortest}}
		}
		req := api.WorkflowRequest{Retention: shortest, Nodes: []api.WorkflowNode{
			node(0, "a", ""), node(1, "b", "a", "a"), node(2, "c", "", "a"), node(3, "d", "b", "b", "c")}}
		if _, err := l.client.SubmitWorkflow(ctx, req); err != nil {
			l.failed(ctx, err)
			continue
		}
		for i := range int64(4) {
			l.ack(first + i)
		}
		l.nodes.Add(4)
	}
}

func (l *load) failed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	l.errs.Add(1)
	l.lastErr.Store(err.Error())
}

func (l *load) ack(n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for int64(len(l.acked)) <= n {
		l.acked = append(l.acked, false)
	}
	l.acked[n] = true
}

// ackedSet returns the acknowledged numbers' flags, by N.
func (l *load) ackedSet() []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]bool(nil), l.acked...)
}
