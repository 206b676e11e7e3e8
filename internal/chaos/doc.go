// Package chaos is the harness of stint's fault suite: a workload over
// server processes (the test binary run again, see Main), faults injected
// while it runs, and a checker that classifies every task in Jepsen's
// terms: ok, lost, duplicated, recovered (Cluster.Check). The tests are in
// its subpackages, one a concern; each is a test binary with a PostgreSQL
// cluster of its own, so `go test` runs them in parallel processes and no
// two share a server or a port:
//
//   - kill: nodes killed (SIGKILL) and stopped past their lease (SIGSTOP)
//     under the workload;
//   - database: a PostgreSQL restart, terminated backends, a transaction
//     pinning xmin, writes refused, a full disk and a PgBouncer restart;
//   - network: a proxy that cuts and delays traffic, silent network losses
//     (the proxy blackholes traffic, then forgets the connections it
//     held), a server dropping the sessions of a vanished node, and a
//     server's Stop and its store's Close on dead connections;
//   - failover: a failover to a promoted synchronous standby, a server in
//     recovery, a failover to an asynchronous standby and failovers by
//     pg_auto_failover, each compared with a client's ledger;
//   - freeze: a process frozen at a fault point inside a transaction that
//     holds what the other nodes wait for, and how long they wait;
//   - flow: rate limits and concurrency caps through kills, freezes and a
//     restart;
//   - workflow: workflows under SIGKILL, SIGSTOP and a PostgreSQL restart
//     at once;
//   - restore: a base backup taken while nodes work, restored into a
//     fresh cluster with new nodes;
//   - signals: tasks that receive signals and sleep on them while nodes
//     are killed and stopped between a message's store and its
//     consumption, checked against a ledger written with each
//     consumption.
//
// The database incidents also check the nodes' logs: one line when an
// incident starts, one when it ends, at most one a second between. Run
// the suite with `go test ./internal/chaos/...`; `-chaos.long` runs
// longer workloads and faults; `-chaos.logs DIR` keeps the node
// processes' JSON logs under DIR, a directory per test, for a failure's
// reader.
package chaos
