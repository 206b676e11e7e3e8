// Package failover holds the fault suite's failovers (see package
// chaos), on clusters of their own: to a promoted synchronous standby, a
// server in recovery, to an asynchronous standby (what it loses is only
// what followed the standby's replay) and by pg_auto_failover (which it
// installs where it can: a node killed whole; in the long mode a
// switchover, two failovers in a row and a server killed alone). The last
// two compare a client's ledger (acknowledged submits, awaited results)
// with the database after the failover.
package failover
