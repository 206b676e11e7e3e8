// Package kill holds the fault suite's process faults (see package
// chaos): nodes killed with SIGKILL and stopped with SIGSTOP past their
// lease while the workload runs; nothing acknowledged lost, no effect
// duplicated, and a killed node's tasks taken over about a lease after.
package kill
