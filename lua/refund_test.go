package lua_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// failSettles is a go-redis hook that fails every settle.lua call while on is set,
// without sending it, and counts the calls it failed.
type failSettles struct {
	sha    string
	on     atomic.Bool
	failed atomic.Int64
}

func newFailSettles() *failSettles {
	sum := sha1.Sum([]byte(lua.SettleSource))
	return &failSettles{sha: hex.EncodeToString(sum[:])}
}

func (h *failSettles) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failSettles) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failSettles) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if h.on.Load() && len(args) > 1 && (fmt.Sprint(args[1]) == h.sha || fmt.Sprint(args[1]) == lua.SettleSource) {
			h.failed.Add(1)
			err := errors.New("injected: settle not sent")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// TestRefundFailureIsUncertain: when a later slot group of a decision fails with a
// certain error, the decision's error is certain only if the earlier groups' spend was
// given back; when that refund fails, the spend stays and the error says the budget may
// have been spent (StoreError.Uncertain).
func TestRefundFailureIsUncertain(t *testing.T) {
	c := redistest.Start(t).Client(t)
	h := newFailSettles()
	c.AddHook(h)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("refund fails %v", fail), func(t *testing.T) {
			site := ratebudget.Check{Rule: ratebudget.Rule{Name: fmt.Sprint("site", fail), Limit: 10, Window: time.Hour}, Cost: 1}
			user := ratebudget.Check{Rule: ratebudget.Rule{Name: "user", Limit: 10, Window: time.Hour}, Identity: fmt.Sprint("ann", fail), Cost: 1}
			// The user's counter is corrupt: its group fails with an error reply, after
			// the site's group (another slot) was admitted.
			if err := c.Set(ctx, l.Key(user), "corrupt", time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			h.on.Store(fail)
			defer h.on.Store(false)
			before := h.failed.Load()
			_, err := l.Allow(ctx, []ratebudget.Check{site, user})
			var se *ratebudget.StoreError
			if !errors.As(err, &se) || se.Class != ratebudget.ClassServer {
				t.Fatalf("Allow = %v, want the user group's server error", err)
			}
			spent := c.Exists(ctx, l.Key(site)).Val() == 1
			if fail && (h.failed.Load() == before || !spent) {
				t.Fatalf("the refund was not attempted and failed (%d settles failed, site spent %v)", h.failed.Load()-before, spent)
			}
			if spent && !se.Uncertain {
				t.Fatalf("Allow = %v: a certain error, but the site's budget stays spent (counter %q)", err, c.Get(ctx, l.Key(site)).Val())
			}
			if !fail && (spent || se.Uncertain) {
				t.Fatalf("Allow = %v with site spent %v; want the spend given back and a certain error", err, spent)
			}
		})
	}
}
