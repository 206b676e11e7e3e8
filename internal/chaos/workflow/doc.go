// Package workflow holds the fault suite's workflows under faults (see
// package chaos): random workflows under SIGKILL, SIGSTOP and a PostgreSQL
// restart at once; each node's effect exactly once and after its
// dependencies'.
package workflow
