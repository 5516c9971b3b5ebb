package timerule

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	_ "time/tzdata" // the zones below, whatever the machine has installed

	"github.com/ratebudget/ratebudget"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// TestPeriodOf: the period containing an instant, exact to the second, on the days
// clocks change (23 h and 25 h days), at month and year ends, on 29 February, and in
// zones of quarter- and half-hour offsets and of +13:00.
func TestPeriodOf(t *testing.T) {
	ny := mustZone(t, "America/New_York")
	ktm := mustZone(t, "Asia/Kathmandu")
	tonga := mustZone(t, "Pacific/Tongatapu")
	stj := mustZone(t, "America/St_Johns")
	lhi := mustZone(t, "Australia/Lord_Howe")
	havana := mustZone(t, "America/Havana")
	tt := []struct {
		name       string
		at         string
		p          ratebudget.Period
		loc        *time.Location
		week       time.Weekday
		start, end string
		hours      float64 // the period's length, 0 when not asserted
	}{
		{"utc_day", "2026-12-05T23:59:59Z", ratebudget.Day, nil, 0, "2026-12-05T00:00:00Z", "2026-12-06T00:00:00Z", 24},
		{"utc_day_first_instant", "2026-12-06T00:00:00Z", ratebudget.Day, nil, 0, "2026-12-06T00:00:00Z", "2026-12-07T00:00:00Z", 24},
		{"ny_23h_day", "2026-03-08T12:00:00Z", ratebudget.Day, ny, 0, "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", 23},
		{"ny_25h_day", "2026-11-01T12:00:00Z", ratebudget.Day, ny, 0, "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z", 25},
		{"ny_25h_day_last_second", "2026-11-02T04:59:59Z", ratebudget.Day, ny, 0, "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z", 25},
		{"ny_midnight_edt", "2026-07-04T03:59:59Z", ratebudget.Day, ny, 0, "2026-07-03T04:00:00Z", "2026-07-04T04:00:00Z", 24},
		{"ny_hour_before_spring", "2026-03-08T06:59:59Z", ratebudget.Hour, ny, 0, "2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", 1},
		{"ny_hour_after_spring", "2026-03-08T07:10:00Z", ratebudget.Hour, ny, 0, "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z", 1},
		{"ny_first_1am_hour", "2026-11-01T05:30:00Z", ratebudget.Hour, ny, 0, "2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", 1},
		{"ny_second_1am_hour", "2026-11-01T06:30:00Z", ratebudget.Hour, ny, 0, "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z", 1},
		{"ny_week_over_spring", "2026-03-10T12:00:00Z", ratebudget.Week, ny, time.Sunday, "2026-03-08T05:00:00Z", "2026-03-15T04:00:00Z", 167},
		{"ny_month_over_fall", "2026-11-30T12:00:00Z", ratebudget.Month, ny, 0, "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z", 30*24 + 1},
		{"week_sunday", "2026-12-05T12:00:00Z", ratebudget.Week, nil, time.Sunday, "2026-11-29T00:00:00Z", "2026-12-06T00:00:00Z", 168},
		{"week_monday_on_sunday", "2026-12-06T12:00:00Z", ratebudget.Week, nil, time.Monday, "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z", 168},
		{"week_monday_on_monday", "2026-12-07T00:00:00Z", ratebudget.Week, nil, time.Monday, "2026-12-07T00:00:00Z", "2026-12-14T00:00:00Z", 168},
		{"week_saturday_over_year", "2026-12-31T12:00:00Z", ratebudget.Week, nil, time.Saturday, "2026-12-26T00:00:00Z", "2027-01-02T00:00:00Z", 168},
		{"month_31_last_second", "2026-01-31T23:59:59Z", ratebudget.Month, nil, 0, "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", 31 * 24},
		{"month_feb_common", "2026-02-28T23:59:59Z", ratebudget.Month, nil, 0, "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z", 28 * 24},
		{"month_feb_leap", "2028-02-29T12:00:00Z", ratebudget.Month, nil, 0, "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", 29 * 24},
		{"day_29_february", "2028-02-29T12:00:00Z", ratebudget.Day, nil, 0, "2028-02-29T00:00:00Z", "2028-03-01T00:00:00Z", 24},
		{"month_december", "2026-12-31T23:59:59Z", ratebudget.Month, nil, 0, "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", 31 * 24},
		{"year_leap", "2028-07-01T00:00:00Z", ratebudget.Year, nil, 0, "2028-01-01T00:00:00Z", "2029-01-01T00:00:00Z", 366 * 24},
		{"kathmandu_day_last_second", "2026-06-15T18:14:59Z", ratebudget.Day, ktm, 0, "2026-06-14T18:15:00Z", "2026-06-15T18:15:00Z", 24},
		{"kathmandu_day_first_second", "2026-06-15T18:15:00Z", ratebudget.Day, ktm, 0, "2026-06-15T18:15:00Z", "2026-06-16T18:15:00Z", 24},
		{"kathmandu_hour", "2026-06-15T10:20:00Z", ratebudget.Hour, ktm, 0, "2026-06-15T10:15:00Z", "2026-06-15T11:15:00Z", 1},
		{"kathmandu_hour_before_quarter", "2026-06-15T10:14:59Z", ratebudget.Hour, ktm, 0, "2026-06-15T09:15:00Z", "2026-06-15T10:15:00Z", 1},
		{"tongatapu_year_last_second", "2026-12-31T10:59:59Z", ratebudget.Year, tonga, 0, "2025-12-31T11:00:00Z", "2026-12-31T11:00:00Z", 365 * 24},
		{"tongatapu_year_first_second", "2026-12-31T11:00:00Z", ratebudget.Year, tonga, 0, "2026-12-31T11:00:00Z", "2027-12-31T11:00:00Z", 365 * 24},
		{"tongatapu_day_utc_yesterday", "2026-12-05T11:30:00Z", ratebudget.Day, tonga, 0, "2026-12-05T11:00:00Z", "2026-12-06T11:00:00Z", 24},
		{"st_johns_day", "2026-06-15T02:29:59Z", ratebudget.Day, stj, 0, "2026-06-14T02:30:00Z", "2026-06-15T02:30:00Z", 24},
		{"st_johns_23h_day", "2026-03-08T12:00:00Z", ratebudget.Day, stj, 0, "2026-03-08T03:30:00Z", "2026-03-09T02:30:00Z", 23},
		{"st_johns_25h_day", "2026-11-01T12:00:00Z", ratebudget.Day, stj, 0, "2026-11-01T02:30:00Z", "2026-11-02T03:30:00Z", 25},
		{"st_johns_month_over_spring", "2026-03-31T12:00:00Z", ratebudget.Month, stj, 0, "2026-03-01T03:30:00Z", "2026-04-01T02:30:00Z", 31*24 - 1},
		{"st_johns_hour", "2026-06-15T12:00:00Z", ratebudget.Hour, stj, 0, "2026-06-15T11:30:00Z", "2026-06-15T12:30:00Z", 1},
		// Lord Howe moves its clock by 30 minutes, from 02:00 to 02:30: the hour after
		// the change starts at it and lasts 30 minutes.
		{"lord_howe_hour_before_change", "2026-10-03T15:20:00Z", ratebudget.Hour, lhi, 0, "2026-10-03T14:30:00Z", "2026-10-03T15:30:00Z", 1},
		{"lord_howe_hour_after_change", "2026-10-03T15:45:00Z", ratebudget.Hour, lhi, 0, "2026-10-03T15:30:00Z", "2026-10-03T16:00:00Z", 0.5},
		// Havana skips its midnight (00:00 becomes 01:00): the day starts at the change.
		{"havana_day_without_midnight", "2026-03-08T12:00:00Z", ratebudget.Day, havana, 0, "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", 23},
		{"havana_day_before_skipped_midnight", "2026-03-08T04:30:00Z", ratebudget.Day, havana, 0, "2026-03-07T05:00:00Z", "2026-03-08T05:00:00Z", 24},
		// Havana turns 01:00 back to 00:00: the day starts at the first midnight.
		{"havana_day_of_two_midnights", "2026-11-01T04:30:00Z", ratebudget.Day, havana, 0, "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z", 25},
		{"havana_day_before_two_midnights", "2026-11-01T03:59:59Z", ratebudget.Day, havana, 0, "2026-10-31T04:00:00Z", "2026-11-01T04:00:00Z", 24},
	}
	for _, tc := range tt {
		t.Run(tc.name, func(t *testing.T) {
			start, end := PeriodOf(utc(tc.at), tc.p, tc.loc, tc.week)
			if !start.Equal(utc(tc.start)) || !end.Equal(utc(tc.end)) {
				t.Fatalf("PeriodOf(%s, %v, %v, %v) = [%s, %s), want [%s, %s)", tc.at, tc.p, tc.loc, tc.week,
					start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339), tc.start, tc.end)
			}
			if got := end.Sub(start).Hours(); tc.hours != 0 && got != tc.hours {
				t.Errorf("period lasts %vh, want %vh", got, tc.hours)
			}
		})
	}
}

// TestPeriodsTile: every hour of 2026, and random instants of 2024-2030, in zones of every kind, the period
// contains the instant, its boundaries are whole seconds, and it meets the periods
// before and after it exactly: the periods cover time without gap or overlap.
func TestPeriodsTile(t *testing.T) {
	zones := []*time.Location{nil, mustZone(t, "America/New_York"), mustZone(t, "Asia/Kathmandu"),
		mustZone(t, "Pacific/Tongatapu"), mustZone(t, "America/St_Johns"), mustZone(t, "Australia/Lord_Howe"),
		mustZone(t, "America/Havana"), mustZone(t, "Europe/London"), mustZone(t, "Pacific/Chatham")}
	tiles := func(at time.Time, p ratebudget.Period, loc *time.Location, week time.Weekday) {
		t.Helper()
		start, end := PeriodOf(at, p, loc, week)
		if at.Before(start) || !at.Before(end) || start.Nanosecond() != 0 || end.Nanosecond() != 0 {
			t.Fatalf("PeriodOf(%v, %v, %v, %v) = [%v, %v): does not contain it in whole seconds", at, p, loc, week, start, end)
		}
		if _, e := PeriodOf(start.Add(-time.Millisecond), p, loc, week); !e.Equal(start) {
			t.Fatalf("%v %v %v: the period before [%v, %v) ends at %v", p, loc, week, start, end, e)
		}
		if s, _ := PeriodOf(end, p, loc, week); !s.Equal(end) {
			t.Fatalf("%v %v %v: the period after [%v, %v) starts at %v", p, loc, week, start, end, s)
		}
	}
	// Every hour of 2026, by day and hour: each change of clock of these zones.
	for at := utc("2026-01-01T00:00:00Z"); at.Year() == 2026; at = at.Add(time.Hour) {
		for _, loc := range zones {
			tiles(at, ratebudget.Day, loc, 0)
			tiles(at, ratebudget.Hour, loc, 0)
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	lo, hi := utc("2024-01-01T00:00:00Z").UnixMilli(), utc("2030-12-31T00:00:00Z").UnixMilli()
	for range 5_000 {
		p := []ratebudget.Period{ratebudget.Hour, ratebudget.Day, ratebudget.Week, ratebudget.Month, ratebudget.Year}[rng.IntN(5)]
		week := time.Sunday
		if p == ratebudget.Week {
			week = time.Weekday(rng.IntN(7))
		}
		tiles(time.UnixMilli(lo+rng.Int64N(hi-lo)), p, zones[rng.IntN(len(zones))], week)
	}
}

// TestPeriodCache: the cache answers what PeriodOf does, for rules that share or
// collide on its slots, on a clock that moves forward and back across periods; and a
// lookup within a cached period allocates nothing.
func TestPeriodCache(t *testing.T) {
	ny, ktm := mustZone(t, "America/New_York"), mustZone(t, "Asia/Kathmandu")
	rules := []ratebudget.Rule{
		{Name: "d", Algorithm: ratebudget.Calendar, Limit: 1, Period: ratebudget.Day},
		{Name: "dny", Algorithm: ratebudget.Calendar, Limit: 1, Period: ratebudget.Day, Location: ny},
		{Name: "dktm", Algorithm: ratebudget.Calendar, Limit: 1, Period: ratebudget.Day, Location: ktm},
		{Name: "h", Algorithm: ratebudget.Calendar, Limit: 1, Period: ratebudget.Hour, Location: ktm},
		{Name: "wmon", Algorithm: ratebudget.Calendar, Limit: 1, Period: ratebudget.Week, WeekStart: time.Monday},
		{Name: "w", Algorithm: ratebudget.Calendar, Limit: 1, Period: ratebudget.Week},
		{Name: "m", Algorithm: ratebudget.Calendar, Limit: 1, Period: ratebudget.Month, Location: ny},
	}
	var c PeriodCache
	rng := rand.New(rand.NewPCG(5, 6))
	now := utc("2026-10-30T00:00:00Z").UnixMilli()
	for range 20_000 {
		now += rng.Int64N(4*3600_000) - 3600_000 // mostly forward, sometimes back
		r := &rules[rng.IntN(len(rules))]
		s, e := c.Of(r, now)
		ws, we := PeriodOf(time.UnixMilli(now), r.Period, r.Location, r.WeekStart)
		if s != ws.UnixMilli() || e != we.UnixMilli() {
			t.Fatalf("%s at %v: cache [%d, %d), PeriodOf [%v, %v)", r.Name, time.UnixMilli(now).UTC(), s, e, ws, we)
		}
		before, _ := PeriodOf(ws.Add(-time.Millisecond), r.Period, r.Location, r.WeekStart)
		_, after := PeriodOf(we, r.Period, r.Location, r.WeekStart)
		want := fmt.Sprintf("%d:%d:%d:%d", before.UnixMilli(), s, e, after.UnixMilli())
		if got := c.Bounds(r, now); got != want {
			t.Fatalf("%s at %v: Bounds %q, want %q", r.Name, time.UnixMilli(now).UTC(), got, want)
		}
	}
	r := &rules[1]
	c.Of(r, now)
	if n := testing.AllocsPerRun(100, func() { c.Of(r, now); c.Bounds(r, now) }); n != 0 {
		t.Errorf("a cached lookup allocates %v times, want 0", n)
	}
}
