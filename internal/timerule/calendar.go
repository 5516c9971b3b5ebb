package timerule

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ratebudget/ratebudget"
)

// PeriodOf is the calendar period p of loc (nil: UTC) that contains t: the half-open
// interval [start, end) from the start of t's hour, day, week (starting on weekStart),
// month or year to the start of the next one, as instants. Days, weeks, months and years
// start at midnight, found by time.Date's normalisation (day 32 is the next month's 1st,
// 29 February exists in leap years only), so that a day is midnight to the next midnight
// also when it lasts 23 or 25 hours; a midnight that a clock change skips starts its day
// at the change. An hour starts at minute 0 of the zone's clock (Asia/Kathmandu's at UTC
// :15) and ends an hour later, or at a change of the zone's offset within it, which
// then starts the next. p must be valid (see [ratebudget.Rule.Validate]).
func PeriodOf(t time.Time, p ratebudget.Period, loc *time.Location, weekStart time.Weekday) (start, end time.Time) {
	if loc == nil {
		loc = time.UTC
	}
	t = t.In(loc)
	if p == ratebudget.Hour {
		return hourOf(t)
	}
	y, m, d := t.Date()
	switch p {
	case ratebudget.Week:
		d -= (int(t.Weekday()) - int(weekStart) + 7) % 7
		return midnight(y, m, d, loc), midnight(y, m, d+7, loc)
	case ratebudget.Month:
		return midnight(y, m, 1, loc), midnight(y, m+1, 1, loc)
	case ratebudget.Year:
		return midnight(y, 1, 1, loc), midnight(y+1, 1, 1, loc)
	}
	return midnight(y, m, d, loc), midnight(y, m, d+1, loc)
}

// midnight is the first instant of day d of month m of year y in loc (time.Date's
// normalisation: day 0 is the last day of the month before): its midnight, or when a
// change of clock skips midnight, the change; when a clock turned back repeats midnight,
// the first.
func midnight(y int, m time.Month, d int, loc *time.Location) time.Time {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	zs, ze := t.ZoneBounds()
	if h := t.Hour(); h != 0 || t.Minute() != 0 || t.Second() != 0 {
		// Skipped: time.Date read the clock in the zone before or after the change.
		if h >= 12 {
			return ze
		}
		return zs
	}
	if zs.IsZero() {
		return t
	}
	// Repeated: the same clock reading in the zone before the change, if it was then.
	_, before := zs.Add(-time.Second).Zone()
	_, now := t.Zone()
	if e := t.Add(-time.Duration(before-now) * time.Second); before > now && e.Before(zs) && e.In(loc).Hour() == 0 && e.In(loc).Minute() == 0 {
		return e
	}
	return t
}

// hourOf is PeriodOf's hour: minute 0 of t's clock hour to an hour later, cut at the
// changes of t's zone offset around t.
func hourOf(t time.Time) (start, end time.Time) {
	start = t.Add(-(time.Duration(t.Minute())*time.Minute + time.Duration(t.Second())*time.Second + time.Duration(t.Nanosecond())))
	end = start.Add(time.Hour)
	zs, ze := t.ZoneBounds()
	if !zs.IsZero() && zs.After(start) {
		start = zs
	}
	if !ze.IsZero() && ze.Before(end) {
		end = ze
	}
	return start, end
}

// PeriodCache keeps, for the calendar rules a limiter decides, the period that contains
// the clock's latest reading, so that a decision within it costs two comparisons and no
// time zone arithmetic. Its zero value is empty and ready; it is safe for concurrent use,
// and Of allocates only when a period is computed (once per period per slot).
type PeriodCache struct {
	slots [cacheSlots]atomic.Pointer[cachedPeriod]
}

// cacheSlots is the number of periods a PeriodCache keeps: rules of the same Period,
// WeekStart and Location share a slot, others may collide and recompute.
const cacheSlots = 16

// cachedPeriod is one period of a PeriodCache: [start, end) in Unix ms, of the rule
// fields that chose it, and the boundaries of the periods around it (see Bounds).
type cachedPeriod struct {
	loc        *time.Location
	p          ratebudget.Period
	weekStart  time.Weekday
	start, end int64
	bounds     string
}

// Of is PeriodOf of the instant now (Unix ms) for the Calendar rule r, in Unix ms.
func (c *PeriodCache) Of(r *ratebudget.Rule, now int64) (start, end int64) {
	e := c.entry(r, now)
	return e.start, e.end
}

// Bounds is the boundaries of the periods before, around and after the instant now
// (Unix ms) for the Calendar rule r: "b0:b1:b2:b3", four Unix ms in decimal, the periods
// [b0, b1), [b1, b2) (the one that contains now) and [b2, b3). It is the form in which
// the lua limiter's script takes a Calendar check's periods, to choose the one that
// contains the server's clock.
func (c *PeriodCache) Bounds(r *ratebudget.Rule, now int64) string {
	return c.entry(r, now).bounds
}

// entry is the cached period of r that contains now, computed and stored when the
// cache holds another.
func (c *PeriodCache) entry(r *ratebudget.Rule, now int64) *cachedPeriod {
	slot := &c.slots[slotOf(r)]
	if e := slot.Load(); e != nil && e.start <= now && now < e.end && e.loc == r.Location && e.p == r.Period && e.weekStart == r.WeekStart {
		return e
	}
	s, e := PeriodOf(time.UnixMilli(now), r.Period, r.Location, r.WeekStart)
	before, _ := PeriodOf(s.Add(-time.Millisecond), r.Period, r.Location, r.WeekStart)
	_, after := PeriodOf(e, r.Period, r.Location, r.WeekStart)
	b := make([]byte, 0, 56)
	for i, t := range [4]time.Time{before, s, e, after} {
		if i > 0 {
			b = append(b, ':')
		}
		b = strconv.AppendInt(b, t.UnixMilli(), 10)
	}
	p := &cachedPeriod{loc: r.Location, p: r.Period, weekStart: r.WeekStart, start: s.UnixMilli(), end: e.UnixMilli(), bounds: string(b)}
	slot.Store(p)
	return p
}

// slotOf is the slot of r's period in a PeriodCache.
func slotOf(r *ratebudget.Rule) int {
	n := 0
	if r.Location != nil {
		n = len(r.Location.String())
	}
	k := 0
	if r.Period != "" {
		k = int(r.Period[0]) // 'h', 'd', 'w', 'm' or 'y': distinct
	}
	return (k*7 + int(r.WeekStart) + n) % cacheSlots
}
