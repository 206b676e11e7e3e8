package chaos

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

func dumpActivity(t *testing.T, dsn string) {
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Log(err)
		return
	}
	defer conn.Close(context.Background())
	rows, _ := conn.Query(context.Background(), `SELECT pid, state, wait_event_type, coalesce(wait_event,''), now()-xact_start, left(query, 120) FROM pg_stat_activity WHERE datname = current_database() AND state <> 'idle' ORDER BY xact_start`)
	for rows.Next() {
		v, _ := rows.Values()
		t.Log(v...)
	}
}
