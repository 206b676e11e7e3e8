// Package chaos holds stint's fault suite: a workload over three server
// processes, faults injected while it runs (SIGKILL, SIGSTOP past the
// lease, a PostgreSQL restart, a proxy that cuts and delays traffic,
// terminated backends, a transaction pinning xmin), and a checker that
// classifies every task in Jepsen's terms: ok, lost, duplicated,
// recovered. Run it with `go test ./internal/chaos`; `-chaos.long` runs
// longer workloads and faults.
package chaos
