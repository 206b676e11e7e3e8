// Package signals holds the fault suite's signals (see package chaos):
// tasks that receive their messages, write each in a ledger in the
// transaction of the checkpoint that consumes it, and sleep until the
// next, while a sender signals them (some messages twice, under the same
// idempotency key) and nodes are killed with SIGKILL and stopped with
// SIGSTOP between a message's store and its consumption; every message
// consumed exactly once, in order, by a run that committed, and every
// wait woken.
package signals
