// Package restore holds the fault suite's restore from a base backup (see
// package chaos): with tasks in every state, pg_basebackup copies the
// database while two nodes work; the old nodes and the old cluster go,
// the backup is started as a fresh cluster, new nodes start on it, and a
// client's ledger is checked against what the restore promises
// (docs/operating.md).
package restore
