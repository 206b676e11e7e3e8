package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// releaseTrimmer is the tracer of a pool's connections: it trims a
// connection's buffers as the pool takes it back (trimOnRelease), which
// pgxpool lets a tracer do in Release itself, and passes every trace to
// the tracer the store was given (see Tracer), if any, for each kind of
// trace that tracer implements.
type releaseTrimmer struct{ inner pgx.QueryTracer }

// TraceRelease trims the released connection's buffers, then passes the
// trace on.
func (t releaseTrimmer) TraceRelease(pool *pgxpool.Pool, data pgxpool.TraceReleaseData) {
	trimOnRelease(data.Conn)
	if r, ok := t.inner.(pgxpool.ReleaseTracer); ok {
		r.TraceRelease(pool, data)
	}
}

func (t releaseTrimmer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if t.inner == nil {
		return ctx
	}
	return t.inner.TraceQueryStart(ctx, conn, data)
}

func (t releaseTrimmer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if t.inner != nil {
		t.inner.TraceQueryEnd(ctx, conn, data)
	}
}

func (t releaseTrimmer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if b, ok := t.inner.(pgx.BatchTracer); ok {
		return b.TraceBatchStart(ctx, conn, data)
	}
	return ctx
}

func (t releaseTrimmer) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	if b, ok := t.inner.(pgx.BatchTracer); ok {
		b.TraceBatchQuery(ctx, conn, data)
	}
}

func (t releaseTrimmer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	if b, ok := t.inner.(pgx.BatchTracer); ok {
		b.TraceBatchEnd(ctx, conn, data)
	}
}

func (t releaseTrimmer) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromStartData) context.Context {
	if c, ok := t.inner.(pgx.CopyFromTracer); ok {
		return c.TraceCopyFromStart(ctx, conn, data)
	}
	return ctx
}

func (t releaseTrimmer) TraceCopyFromEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromEndData) {
	if c, ok := t.inner.(pgx.CopyFromTracer); ok {
		c.TraceCopyFromEnd(ctx, conn, data)
	}
}

func (t releaseTrimmer) TracePrepareStart(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareStartData) context.Context {
	if p, ok := t.inner.(pgx.PrepareTracer); ok {
		return p.TracePrepareStart(ctx, conn, data)
	}
	return ctx
}

func (t releaseTrimmer) TracePrepareEnd(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareEndData) {
	if p, ok := t.inner.(pgx.PrepareTracer); ok {
		p.TracePrepareEnd(ctx, conn, data)
	}
}

func (t releaseTrimmer) TraceConnectStart(ctx context.Context, data pgx.TraceConnectStartData) context.Context {
	if c, ok := t.inner.(pgx.ConnectTracer); ok {
		return c.TraceConnectStart(ctx, data)
	}
	return ctx
}

func (t releaseTrimmer) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	if c, ok := t.inner.(pgx.ConnectTracer); ok {
		c.TraceConnectEnd(ctx, data)
	}
}

func (t releaseTrimmer) TraceAcquireStart(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireStartData) context.Context {
	if a, ok := t.inner.(pgxpool.AcquireTracer); ok {
		return a.TraceAcquireStart(ctx, pool, data)
	}
	return ctx
}

func (t releaseTrimmer) TraceAcquireEnd(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	if a, ok := t.inner.(pgxpool.AcquireTracer); ok {
		a.TraceAcquireEnd(ctx, pool, data)
	}
}
