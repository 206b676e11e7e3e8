package postgres_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store/postgres"
)

func TestOpenRefusesAnEmptyURL(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{"", "  "} {
		st, err := postgres.Open(context.Background(), dsn)
		require.Nil(t, st)
		require.EqualError(t, err, "open store: the database URL is empty: want postgres://user@host/db or key=value settings")
	}
}

// TestSessionsSetTheServersTimeouts checks that every session of the
// pool tells the server to find out a vanished client within seconds
// (keepalives, tcp_user_timeout) and to end a transaction left idle, and
// that a setting the URL or the database makes wins.
func TestSessionsSetTheServersTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.New(t)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	require.NotEmpty(t, u.Port(), "the test database is reached over TCP")
	q := u.Query()
	q.Set("tcp_keepalives_count", "7")
	u.RawQuery = q.Encode()
	for _, tc := range []struct{ dsn, count string }{{dsn, "3"}, {u.String(), "7"}} {
		st, err := postgres.Open(ctx, tc.dsn)
		require.NoError(t, err)
		var idle, interval, count, user, idleTx, jit string
		require.NoError(t, st.Pool().QueryRow(ctx, `SELECT current_setting('tcp_keepalives_idle'),
			current_setting('tcp_keepalives_interval'), current_setting('tcp_keepalives_count'),
			current_setting('tcp_user_timeout'), current_setting('idle_in_transaction_session_timeout'),
			current_setting('jit')`).Scan(&idle, &interval, &count, &user, &idleTx, &jit))
		st.Close()
		require.Equal(t, []string{"10", "5", tc.count, "30000", "10s", "off"}, []string{idle, interval, count, user, idleTx, jit})
	}
	// A timeout the database sets wins.
	st, err := postgres.Open(ctx, dsn)
	require.NoError(t, err)
	defer st.Close()
	var db string
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT current_database()`).Scan(&db))
	_, err = st.Pool().Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET idle_in_transaction_session_timeout = '1min'`)
	require.NoError(t, err)
	st2, err := postgres.Open(ctx, dsn)
	require.NoError(t, err)
	defer st2.Close()
	var idleTx string
	require.NoError(t, st2.Pool().QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&idleTx))
	require.Equal(t, "1min", idleTx)
}

// TestWarmOpensConnectionsUpToThePoolsSize checks that Warm leaves the
// pool holding the connections asked for, idle and ready, and never more
// than the pool's size.
func TestWarmOpensConnectionsUpToThePoolsSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := postgres.Open(ctx, pgtest.New(t), postgres.MaxConns(6))
	require.NoError(t, err)
	defer st.Close()
	require.Less(t, st.Pool().Stat().TotalConns(), int32(4), "a new pool holds the connections it used")

	st.Warm(ctx, 4)
	stat := st.Pool().Stat()
	require.GreaterOrEqual(t, stat.TotalConns(), int32(4))
	require.Equal(t, stat.TotalConns(), stat.IdleConns(), "every warmed connection is back in the pool")

	st.Warm(ctx, 100)
	require.Equal(t, int32(6), st.Pool().Stat().TotalConns())
	st.Warm(ctx, -1) // nothing to open
}
