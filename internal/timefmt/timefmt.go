// Package timefmt writes durations as a person reads them, for messages
// and tables.
package timefmt

import (
	"fmt"
	"strings"
	"time"
)

// day is 24 hours: durations here are spans of time, not calendar days.
const day = 24 * time.Hour

// Duration writes d without the zero units time.Duration.String keeps,
// and in days from a day on: "500ms", "1.5s", "1m", "1h30m", "1 day",
// "366 days", "2 days 6h". A negative d gets a minus sign.
func Duration(d time.Duration) string {
	if d < 0 {
		return "-" + Duration(-d)
	}
	if d < day {
		return short(d)
	}
	days := d / day
	s := fmt.Sprintf("%d days", days)
	if days == 1 {
		s = "1 day"
	}
	if rest := d % day; rest != 0 {
		s += " " + short(rest)
	}
	return s
}

// short is time.Duration.String without trailing zero units: "1h" for
// "1h0m0s", "1h30m" for "1h30m0s", "2m" for "2m0s".
func short(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
