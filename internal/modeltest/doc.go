// Package modeltest holds stint's model-based test: a reference model of
// the task state machine in plain Go, and random, seeded sequences of
// operations (submits with colliding ids, debounced or not, holds of
// tasks and groups, pauses, removes, retries, rewinds and forks from a
// step, resubmits during runs, run outcomes, children, signals (one, or
// several at once, all or none, some with idempotency keys) and runs that
// receive them and sleep on their topic, events, node stops) applied both
// to the model and to real server nodes on a real PostgreSQL. After every
// step the stored state (steps, unconsumed messages and events included)
// must agree with the model, and so must what each run received; the caps
// must hold in the run log, and every task that may run must be running
// within a bound set by the lease and poll interval.
//
// The package has no API; it is all tests. A failing sequence prints its
// seed and its operations, to replay with
//
//	go test ./internal/modeltest -run TestModelReplay -model.ops='...'
//
// or with -model.seed=N.
package modeltest
