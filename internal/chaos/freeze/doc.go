// Package freeze holds the fault suite's frozen processes (see package
// chaos): a node, a migrator or a rate limit's setter stopped at a fault
// point (see internal/faultpoint) inside a transaction that holds what
// the other nodes wait for, and how long they wait.
package freeze
