package impl

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

func TestDueTicks(t *testing.T) {
	t.Parallel()
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		require.NoError(t, err)
		return v
	}
	cases := []struct {
		name, spec, zone string
		after, now       string
		want             string // the due ticks, space-separated; empty: none due
	}{
		{"not yet", "@every 1m", "", "2026-01-01T10:00:00Z", "2026-01-01T10:00:30Z", ""},
		{"due", "@every 1m", "", "2026-01-01T10:00:00Z", "2026-01-01T10:01:00Z", "2026-01-01T10:01:00Z"},
		{"missed ticks fire once, as the latest", "@every 1m", "", "2026-01-01T10:00:00Z", "2026-01-01T13:30:10Z", "2026-01-01T13:30:00Z"},
		{"ticks a late look finds each fire", "@every 1s", "", "2026-01-01T10:00:00Z", "2026-01-01T10:00:03.5Z",
			"2026-01-01T10:00:01Z 2026-01-01T10:00:02Z 2026-01-01T10:00:03Z"},
		{"ticks overdue past the downtime bound fire once", "@every 1s", "", "2026-01-01T10:00:00Z", "2026-01-01T10:00:11.5Z",
			"2026-01-01T10:00:11Z"},
		{"hourly", "@hourly", "", "2026-01-01T10:00:00Z", "2026-01-01T11:59:59Z", "2026-01-01T11:00:00Z"},
		{"cron in a time zone", "0 9 * * *", "Europe/Berlin", "2026-01-01T00:00:00Z", "2026-01-01T08:30:00Z", "2026-01-01T08:00:00Z"},
		{"cron in a time zone, before", "0 9 * * *", "Europe/Berlin", "2026-01-01T00:00:00Z", "2026-01-01T07:59:00Z", ""},
		{"cron across daylight saving", "0 9 * * *", "Europe/Berlin", "2026-07-01T00:00:00Z", "2026-07-01T07:00:00Z", "2026-07-01T07:00:00Z"},
	}
	for _, tc := range cases {
		sched, err := parseSchedule(api.Schedule{Name: "s", Spec: tc.spec, TimeZone: tc.zone})
		require.NoError(t, err, tc.name)
		var want []time.Time
		for _, w := range strings.Fields(tc.want) {
			want = append(want, at(w))
		}
		var got []time.Time
		for _, tick := range dueTicks(sched, at(tc.after), at(tc.now)) {
			got = append(got, tick.UTC())
		}
		require.Equal(t, want, got, tc.name)
	}
}

func TestParseScheduleRefusesBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sc    api.Schedule
		field string
	}{
		{api.Schedule{Name: "", Spec: "@hourly"}, "name"},
		{api.Schedule{Name: "Upper", Spec: "@hourly"}, "name"},
		{api.Schedule{Name: "-dash", Spec: "@hourly"}, "name"},
		{api.Schedule{Name: "a/b", Spec: "@hourly"}, "name"},
		{api.Schedule{Name: "ok", Spec: ""}, "spec"},
		{api.Schedule{Name: "ok", Spec: "* * *"}, "spec"},
		{api.Schedule{Name: "ok", Spec: "61 * * * *"}, "spec"},
		{api.Schedule{Name: "ok", Spec: "@every 100ms"}, "spec"},
		{api.Schedule{Name: "ok", Spec: "@every soon"}, "spec"},
		{api.Schedule{Name: "ok", Spec: "@every 1500ms"}, "spec"},
		{api.Schedule{Name: "ok", Spec: "@hourly", TimeZone: "Mars/Olympus"}, "time_zone"},
	} {
		_, err := parseSchedule(tc.sc)
		var inv *api.InvalidError
		require.ErrorAs(t, err, &inv, "%+v", tc.sc)
		require.Equal(t, tc.field, inv.Field, "%+v", tc.sc)
	}
}
