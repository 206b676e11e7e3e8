// Package database holds the fault suite's faults of the database server
// (see package chaos): a PostgreSQL restart, terminated backends and a
// transaction pinning xmin under the workload, and the incidents writes
// refused, a full disk and a PgBouncer restart, whose log lines the tests
// check too.
package database
