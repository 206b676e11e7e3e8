package store

import "context"

// readPrimaryKey is the context key of ReadPrimary.
type readPrimaryKey struct{}

// ReadPrimary returns a context under which a store serves every read from
// its primary database, even when it sends reads to a standby otherwise.
// A caller uses it where a read must see its own writes or the current
// state: a read back after a write, the first read of an Await, and every
// read a run makes (a run acts on what it reads). Without a standby it
// changes nothing.
func ReadPrimary(ctx context.Context) context.Context {
	return context.WithValue(ctx, readPrimaryKey{}, true)
}

// ReadsPrimary reports whether ctx, or a context it derives from, came from
// ReadPrimary.
func ReadsPrimary(ctx context.Context) bool {
	v, _ := ctx.Value(readPrimaryKey{}).(bool)
	return v
}
