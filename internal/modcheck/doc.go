// Package modcheck holds the test that keeps go.mod's go line at the
// lowest Go release the module's dependencies allow, so that a module that
// requires stint is not made to name a later one by go mod tidy. (CI's
// go mod tidy -diff keeps it from being lower.) It has no code of its own.
package modcheck
