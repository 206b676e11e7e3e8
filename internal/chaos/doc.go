// Package chaos holds stint's fault suite: a workload over three server
// processes, faults injected while it runs (SIGKILL, SIGSTOP past the
// lease, a PostgreSQL restart, a proxy that cuts and delays traffic,
// terminated backends, a transaction pinning xmin), and a checker that
// classifies every task in Jepsen's terms: ok, lost, duplicated,
// recovered. Workflows run under SIGKILL, SIGSTOP and a PostgreSQL
// restart at once (workflow_test.go): each node's effect exactly once and
// after its dependencies'. The database incidents (incidents_test.go) add a failover
// to a promoted synchronous standby, a server in recovery, a silent
// network loss (the proxy blackholes traffic, then forgets the
// connections it held), writes refused, a full disk (disk_test.go) and a
// PgBouncer restart; they also check the nodes' logs: one line when an
// incident starts, one when it ends, at most one a second between. The
// freeze tests (freeze_test.go) stop a process at a fault point inside a
// transaction that holds what the other nodes wait for and measure how
// long they wait. The failover tests compare a client's ledger
// (acknowledged submits, awaited results) with the database after a
// failover: to an asynchronous standby (asyncloss_test.go), and by
// pg_auto_failover (autofailover_test.go, which installs it where it can:
// a node killed whole; in the long mode a switchover, two failovers in a
// row and a server killed alone). Run it with `go test ./internal/chaos`;
// `-chaos.long` runs longer workloads and faults; `-chaos.logs DIR` keeps
// the node processes' JSON logs under DIR, a directory per test, for a
// failure's reader.
package chaos
