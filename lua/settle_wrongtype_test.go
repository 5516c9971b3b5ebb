package lua_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// TestSettleWrongTypeWritesNoHalf: a settle of one slot group whose later check's key
// holds another type than the limiter's (a list where a counter should be, a string
// where a log or the leases should be, written by an operator) does not write the
// earlier checks' settles and then fail with a certain error: that check is not given
// back, as a corrupt counter is not, and the others are settled. A renew of leases
// reports the lease of such a key lost.
func TestSettleWrongTypeWritesNoHalf(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	for _, later := range stateChecks("wt") {
		t.Run(algname.Of(later.Rule.Algorithm), func(t *testing.T) {
			first := stateChecks("wt-" + algname.Of(later.Rule.Algorithm))[0]
			first.Rule.Name = "first"
			later.Identity = first.Identity
			checks := []ratebudget.Check{first, later}
			tickets := make([]ratebudget.Ticket, 2)
			if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
				t.Fatalf("Reserve: %+v, %v", d, err)
			}
			// The operator's value, with the key's own expiry, so that a fixed window's
			// settle reads it as the same window.
			key := l.Key(later)
			at := c.PExpireTime(ctx, key).Val()
			must(t, c.Del(ctx, key).Err())
			if later.Rule.Algorithm <= ratebudget.TokenBucket {
				must(t, c.RPush(ctx, key, "x").Err())
			} else {
				must(t, c.Set(ctx, key, "x", 0).Err())
			}
			if at > 0 {
				must(t, c.PExpireAt(ctx, key, time.UnixMilli(at.Milliseconds())).Err())
			}
			before := stateOf(t, c, key)
			err := l.Settle(ctx, checks, tickets, []int64{0, 0})
			var se *ratebudget.StoreError
			if errors.As(err, &se) && !se.Uncertain {
				if n := c.Exists(ctx, l.Key(first)).Val(); n == 0 {
					t.Fatalf("Settle: %v, a certain error, but the first check was given back", err)
				}
			}
			if err != nil {
				t.Fatalf("Settle: %v, want the first check settled and the other not given back", err)
			}
			if n := c.Exists(ctx, l.Key(first)).Val(); n != 0 {
				t.Fatalf("the first check was not given back: %v", stateOf(t, c, l.Key(first)))
			}
			if got := stateOf(t, c, key); got != before {
				t.Fatalf("the operator's key changed: %v, was %v", got, before)
			}
		})
	}
	t.Run("renew", func(t *testing.T) {
		lease := stateChecks("wt-renew")[3]
		other := lease
		other.Rule.Name = "other"
		checks := []ratebudget.Check{lease, other}
		tickets := make([]ratebudget.Ticket, 2)
		if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
			t.Fatalf("Reserve: %+v, %v", d, err)
		}
		key := l.Key(other)
		must(t, c.Set(ctx, key, "x", 0).Err())
		err := l.Renew(ctx, checks, tickets)
		if !errors.Is(err, ratebudget.ErrLeaseLost) {
			t.Fatalf("Renew: %v, want ErrLeaseLost", err)
		}
		if v := c.Get(ctx, key).Val(); v != "x" {
			t.Fatalf("the operator's key changed: %q", v)
		}
	})
}

// TestSettleFailingAfterWritesIsUncertain: a settle whose command fails after the
// group's earlier checks were settled (here: a user whose ACL lost PTTL, which a token
// bucket's give-back reads) reports an uncertain error, not a certain one that says
// nothing was written.
func TestSettleFailingAfterWritesIsUncertain(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	control := srv.Client(t)
	acl := limiterACL(t, "acl")
	var without []any
	for _, f := range acl {
		if f != "+pttl" {
			without = append(without, f)
		}
	}
	c := aclClient(t, srv, control, "pw", acl)
	l, err := lua.New(c, lua.WithPrefix("acl"), lua.WithRefusalCache(0))
	must(t, err)
	checks := stateChecks("part")
	checks = []ratebudget.Check{checks[2], checks[1]} // a rolling window, then a token bucket
	tickets := make([]ratebudget.Ticket, 2)
	if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
		t.Fatalf("Reserve: %+v, %v", d, err)
	}
	must(t, control.Do(ctx, append([]any{"ACL", "SETUSER", "limiter", "reset"}, without...)...).Err())
	err = l.Settle(ctx, checks, tickets, []int64{0, 0})
	var se *ratebudget.StoreError
	var re redis.Error
	if !errors.As(err, &se) || !se.Uncertain || !errors.As(err, &re) {
		t.Fatalf("Settle: %v, want an uncertain StoreError of the server's reply", err)
	}
	if n := control.Exists(ctx, l.Key(checks[0])).Val(); n != 0 {
		t.Fatalf("the rolling window was not given back, so this test shows nothing")
	}
}
