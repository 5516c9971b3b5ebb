package lua_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
)

// counterForms are fixed-window counters that Lua's tonumber reads as a number but
// INCRBY and DECRBY refuse: a script that trusted tonumber failed at its write, after
// the writes of the checks before it.
var counterForms = []string{"1.5", "05", " 5", "0x5", "nan", "-0", "+5", "-99999999999999999999"}

// TestCorruptCounterWritesNothing: a counter in a form INCRBY refuses is an error reply
// before any write, also for the checks of the group before it, when deciding and when
// charging a settle's extras, so that a certain error means that nothing was spent.
func TestCorruptCounterWritesNothing(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newLimiter(t, c)
	for _, form := range counterForms {
		a := ratebudget.Check{Rule: ratebudget.Rule{Name: "a", Limit: 10, Window: time.Hour}, Identity: "id" + form, Cost: 1}
		b := ratebudget.Check{Rule: ratebudget.Rule{Name: "b", Limit: 10, Window: time.Hour}, Identity: "id" + form, Cost: 1}
		checks := []ratebudget.Check{a, b}
		if err := c.Set(ctx, l.Key(b), form, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		_, err := l.Allow(ctx, checks)
		var se *ratebudget.StoreError
		if !errors.As(err, &se) || se.Class != ratebudget.ClassServer || se.Uncertain || !strings.Contains(err.Error(), "corrupt counter") {
			t.Errorf("counter %q: Allow = %v, want a certain corrupt-counter server error", form, err)
		}
		if n := c.Exists(ctx, l.Key(a)).Val(); n != 0 {
			t.Errorf("counter %q: the other check's counter was written (%q) by a decision that failed", form, c.Get(ctx, l.Key(a)).Val())
		}

		// A settle charging both checks above their reservation.
		c.Del(ctx, l.Key(b))
		tickets := make([]ratebudget.Ticket, 2)
		if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
			t.Fatalf("Reserve: %+v, %v", d, err)
		}
		if err := c.Set(ctx, l.Key(b), form, redis.KeepTTL).Err(); err != nil {
			t.Fatal(err)
		}
		err = l.Settle(ctx, checks, tickets, []int64{3, 3})
		if !errors.As(err, &se) || se.Class != ratebudget.ClassServer || se.Uncertain {
			t.Errorf("counter %q: Settle = %v, want a certain server error", form, err)
		}
		if v := c.Get(ctx, l.Key(a)).Val(); v != "1" {
			t.Errorf("counter %q: the other check's counter is %q after a settle that failed, want \"1\"", form, v)
		}
	}
}

// TestCorruptCounterNotGivenBack: a settle giving back to a counter in a form DECRBY
// refuses skips it, as a closed window, and gives back to the group's other checks: no
// error reply after a write.
func TestCorruptCounterNotGivenBack(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newLimiter(t, c)
	for _, form := range counterForms {
		a := ratebudget.Check{Rule: ratebudget.Rule{Name: "a", Limit: 10, Window: time.Hour}, Identity: "id" + form, Cost: 4}
		b := ratebudget.Check{Rule: ratebudget.Rule{Name: "b", Limit: 10, Window: time.Hour}, Identity: "id" + form, Cost: 4}
		checks := []ratebudget.Check{a, b}
		tickets := make([]ratebudget.Ticket, 2)
		if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
			t.Fatalf("Reserve: %+v, %v", d, err)
		}
		if err := c.Set(ctx, l.Key(b), form, redis.KeepTTL).Err(); err != nil {
			t.Fatal(err)
		}
		if err := l.Settle(ctx, checks, tickets, nil); err != nil {
			t.Errorf("counter %q: Settle = %v, want the other check given back", form, err)
		}
		if n := c.Exists(ctx, l.Key(a)).Val(); n != 0 {
			t.Errorf("counter %q: the other check's counter is %q, want it given back", form, c.Get(ctx, l.Key(a)).Val())
		}
		if v := c.Get(ctx, l.Key(b)).Val(); v != form {
			t.Errorf("counter %q became %q", form, v)
		}
	}
}

// TestCorruptCounterSingleCheck: a single check's counter in a form INCRBY refuses is a
// certain server error (INCRBY's own refusal, its only write), and the value is left as
// it was.
func TestCorruptCounterSingleCheck(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newLimiter(t, c)
	for _, form := range counterForms {
		a := ratebudget.Check{Rule: ratebudget.Rule{Name: "a", Limit: 10, Window: time.Hour}, Identity: "single" + form, Cost: 1}
		if err := c.Set(ctx, l.Key(a), form, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		d, err := l.Allow(ctx, []ratebudget.Check{a})
		var se *ratebudget.StoreError
		if !errors.As(err, &se) || se.Class != ratebudget.ClassServer || se.Uncertain {
			t.Errorf("counter %q: Allow = %+v, %v; want a certain server error", form, d, err)
		}
		if v := c.Get(ctx, l.Key(a)).Val(); v != form {
			t.Errorf("counter %q became %q", form, v)
		}
	}
}
