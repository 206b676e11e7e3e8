// Package soak holds stint's soak test: steady load for hours, which
// finds what drifts slowly (memory, bloat, a backlog the cleanup does not
// keep up with) rather than what breaks at once.
//
// TestSoak starts a PostgreSQL cluster of its own at the server's
// defaults and two node processes at stint's defaults (the cleanup
// behavior included), and submits a steady mix at a fixed rate
// (-soak.rate, 300 tasks a second by default, well below what two cores
// carry): of every ten tasks four no-ops, three of 20-200 ms, one failing
// its first attempt and two under a group key capped at four running;
// with a workflow of four nodes every two seconds (one node reads
// another's result) and a schedule firing every second. Every task, node
// and workflow has the shortest retention stint keeps (a microsecond), so
// that the cleanup must keep up with the load.
//
// Every -soak.every (30 s) it logs a sample as a line of a table, and
// writes them all as CSV to -soak.csv when given: the submits and the tasks
// done a second, the p99 from submit to the start of a task's first
// attempt, each node's RSS, heap, goroutines and CPU, PostgreSQL's CPU, the
// size of every stint table and index, dead tuples and autovacuum runs of
// every table, WAL bytes per task, the change feed's size, and the finished
// tasks kept past their retention plus a cleanup interval and a minute. At
// the end it fails unless the goals hold: over the last half each sample's
// throughput within 5% of the rate, every node's RSS and every relation's
// size flat within 10% (the most of the last quarter against the most of
// the third, as tables shrink and refill); the p99 of the last third within
// 1.2 times the first third's; no table's dead tuples growing from the
// middle third to the last; no task kept past that bound; and a ledger of
// the acknowledged tasks and their effects with none lost, none run twice
// and no tick fired twice.
//
// It is off in `go test ./...`; run it with
//
//	go test ./internal/soak -run TestSoak -v -soak.duration=1h -timeout=2h -soak.csv=soak.csv
//
// and -soak.logs DIR to keep the nodes' JSON logs.
package soak
