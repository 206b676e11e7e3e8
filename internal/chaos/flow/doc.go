// Package flow holds the fault suite's flow-control checks (see package
// chaos): rate limits and concurrency caps hold through SIGKILL, SIGSTOP
// past the lease and a PostgreSQL restart.
package flow
