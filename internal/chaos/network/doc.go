// Package network holds the fault suite's faults of the network between
// nodes and PostgreSQL (see package chaos), through a proxy that cuts,
// delays and blackholes traffic: a silent loss that every node resumes
// from within its bound, a server that drops the sessions of a vanished
// node, and Server.Stop and Store.Close that end on dead connections.
package network
