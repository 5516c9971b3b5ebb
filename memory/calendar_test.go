package memory_test

import (
	"context"
	"testing"
	"time"

	_ "time/tzdata" // the zones below, whatever the machine has installed

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/memory"
)

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

// TestCalendarPeriods: a Calendar rule admits Limit in the period that contains the
// clock, refuses with Reset and Retry-After at the period's end exactly (on 23 h and 25 h
// days, month ends, 29 February, and in zones of +05:45, +13:00 and -03:30), refuses
// until the last millisecond of the period, and starts the next period at 0 with the next
// period's length to its reset.
func TestCalendarPeriods(t *testing.T) {
	ny, ktm := zone(t, "America/New_York"), zone(t, "Asia/Kathmandu")
	tonga, stj := zone(t, "Pacific/Tongatapu"), zone(t, "America/St_Johns")
	tt := []struct {
		name    string
		p       ratebudget.Period
		loc     *time.Location
		week    time.Weekday
		now     string
		end     string        // the period's end
		nextLen time.Duration // the length of the period after it
	}{
		{"ny_23h_day", ratebudget.Day, ny, 0, "2026-03-08T10:00:00.250Z", "2026-03-09T04:00:00Z", 24 * time.Hour},
		{"ny_day_before_25h_day", ratebudget.Day, ny, 0, "2026-10-31T20:00:00Z", "2026-11-01T04:00:00Z", 25 * time.Hour},
		{"ny_hour_before_fall_back", ratebudget.Hour, ny, 0, "2026-11-01T05:59:59.999Z", "2026-11-01T06:00:00Z", time.Hour},
		{"utc_month_january", ratebudget.Month, nil, 0, "2026-01-31T23:00:00Z", "2026-02-01T00:00:00Z", 28 * 24 * time.Hour},
		{"utc_day_29_february", ratebudget.Day, nil, 0, "2028-02-29T00:00:00Z", "2028-03-01T00:00:00Z", 24 * time.Hour},
		{"utc_month_february_leap", ratebudget.Month, nil, 0, "2028-02-10T00:00:00Z", "2028-03-01T00:00:00Z", 31 * 24 * time.Hour},
		{"kathmandu_day", ratebudget.Day, ktm, 0, "2026-06-15T18:00:00Z", "2026-06-15T18:15:00Z", 24 * time.Hour},
		{"kathmandu_hour", ratebudget.Hour, ktm, 0, "2026-06-15T10:20:00Z", "2026-06-15T11:15:00Z", time.Hour},
		{"tongatapu_year", ratebudget.Year, tonga, 0, "2026-12-31T10:00:00Z", "2026-12-31T11:00:00Z", 365 * 24 * time.Hour},
		{"st_johns_month_to_dst", ratebudget.Month, stj, 0, "2026-02-20T12:00:00Z", "2026-03-01T03:30:00Z", 31*24*time.Hour - time.Hour},
		{"st_johns_week_monday", ratebudget.Week, stj, time.Monday, "2026-12-06T12:00:00Z", "2026-12-07T03:30:00Z", 7 * 24 * time.Hour},
	}
	for _, tc := range tt {
		t.Run(tc.name, func(t *testing.T) {
			clk := limitertest.NewFakeClock(at(tc.now))
			m, err := memory.New(memory.WithClock(clk.Now))
			if err != nil {
				t.Fatal(err)
			}
			r := ratebudget.Rule{Name: "quota", Algorithm: ratebudget.Calendar, Limit: 3, Period: tc.p, Location: tc.loc, WeekStart: tc.week}
			c := ratebudget.Check{Rule: r, Identity: "acct", Cost: 1}
			left := at(tc.end).Sub(at(tc.now))
			for i := int64(1); i <= 3; i++ {
				d := allow(t, m, c)
				if !d.Allowed || d.Remaining != 3-i || d.ResetAfter != left || d.Rule != "quota" || d.Limit != 3 {
					t.Fatalf("admission %d: %+v, want Remaining %d, ResetAfter %v", i, d, 3-i, left)
				}
			}
			d := allow(t, m, c)
			if d.Allowed || d.Remaining != 0 || d.RetryAfter != left || d.ResetAfter != left {
				t.Fatalf("refusal: %+v, want RetryAfter and ResetAfter %v", d, left)
			}
			clk.Advance(left - time.Millisecond)
			if d := allow(t, m, c); d.Allowed || d.RetryAfter != time.Millisecond {
				t.Fatalf("the period's last ms: %+v, want refused with RetryAfter 1ms", d)
			}
			clk.Advance(time.Millisecond)
			if d := allow(t, m, c); !d.Allowed || d.Remaining != 2 || d.ResetAfter != tc.nextLen {
				t.Fatalf("the next period's first ms: %+v, want admitted with Remaining 2 and ResetAfter %v", d, tc.nextLen)
			}
		})
	}
}

// TestCalendarNotAnchored: a Calendar period is the calendar's, not one opened by the
// first request: a request at 23:59 and one at 00:01 are in two days; a request
// later in the same period does not move its end; and a budget idle for periods
// starts at 0.
func TestCalendarNotAnchored(t *testing.T) {
	clk := limitertest.NewFakeClock(at("2026-12-05T23:59:00Z"))
	m, err := memory.New(memory.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	r := ratebudget.Rule{Name: "daily", Algorithm: ratebudget.Calendar, Limit: 1, Period: ratebudget.Day}
	c := ratebudget.Check{Rule: r, Cost: 1}
	if d := allow(t, m, c); !d.Allowed || d.ResetAfter != time.Minute {
		t.Fatalf("23:59: %+v, want admitted, reset in 1m", d)
	}
	clk.Advance(2 * time.Minute)
	if d := allow(t, m, c); !d.Allowed || d.ResetAfter != 24*time.Hour-time.Minute {
		t.Fatalf("00:01 the next day: %+v, want admitted, reset at midnight", d)
	}
	clk.Advance(10 * time.Hour)
	if d := allow(t, m, c); d.Allowed || d.RetryAfter != 14*time.Hour-time.Minute {
		t.Fatalf("10:01: %+v, want refused until midnight", d)
	}
	clk.Advance(72 * time.Hour)
	if d := allow(t, m, c); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("three days later: %+v, want admitted from 0", d)
	}
}

// TestCalendarSettle: a Calendar reservation cancelled in its period is given back; one
// settled after its period ended gives nothing back to the next period; an extra charge
// goes into the period of the settle.
func TestCalendarSettle(t *testing.T) {
	clk := limitertest.NewFakeClock(at("2026-12-05T12:00:00Z"))
	m, err := memory.New(memory.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := ratebudget.Rule{Name: "daily", Algorithm: ratebudget.Calendar, Limit: 10, Period: ratebudget.Day}
	checks := []ratebudget.Check{{Rule: r, Cost: 4}}
	tickets := make([]ratebudget.Ticket, 1)
	reserve := func() {
		t.Helper()
		if d, err := m.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
			t.Fatalf("Reserve: %+v, %v", d, err)
		}
	}
	settle := func(cost int64) {
		t.Helper()
		if err := m.Settle(ctx, checks, tickets, []int64{cost}); err != nil {
			t.Fatal(err)
		}
	}
	reserve()
	settle(1) // 3 given back
	if d := probe(t, m, r, "", ""); d.Remaining != 9 {
		t.Fatalf("after a settle at 1 of 4: Remaining %d, want 9", d.Remaining)
	}
	reserve() // 5 spent
	clk.Advance(12 * time.Hour)
	settle(0) // the period ended: nothing to give back
	if d := probe(t, m, r, "", ""); d.Remaining != 10 || d.ResetAfter != 0 {
		t.Fatalf("a new period after a late cancel: %+v, want untouched", d)
	}
	reserve()
	settle(7) // 3 more charged
	if d := probe(t, m, r, "", ""); d.Remaining != 3 || d.ResetAfter != 24*time.Hour {
		t.Fatalf("after a charge of 3 more: %+v, want Remaining 3, reset at midnight", d)
	}
}
