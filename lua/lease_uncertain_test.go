package lua_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// lostReply is a go-redis hook that, once armed, lets the next allow.lua call run and
// then loses its reply (the connection broke after the command was sent: an uncertain
// error), and reports every settle.lua call that has run on settled.
type lostReply struct {
	armed   atomic.Bool
	settled chan struct{}
}

func (h *lostReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lostReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *lostReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	allow, settle := sha1hex(lua.AllowSource), sha1hex(lua.SettleSource)
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); cmd.Name() == "evalsha" && len(args) > 1 {
			switch args[1] {
			case allow:
				if h.armed.CompareAndSwap(true, false) {
					return io.ErrUnexpectedEOF
				}
			case settle:
				h.settled <- struct{}{}
			}
		}
		return err
	}
}

func sha1hex(s string) string {
	h := sha1.Sum([]byte(s))
	return hex.EncodeToString(h[:])
}

// A decision taking an in-flight lease whose reply is lost (the script ran, the caller
// got an uncertain error and was not admitted) must not leave the lease held until its
// TTL: the limiter releases it, so the slot is free again for the next request.
func TestUncertainLeaseIsReleased(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	hook := &lostReply{settled: make(chan struct{}, 4)}
	client.AddHook(hook)
	l := newLimiter(t, client)
	slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Hour}
	ctx := context.Background()
	if err := l.Load(ctx); err != nil { // EVALSHA runs the scripts: no NOSCRIPT round
		t.Fatal(err)
	}
	for _, via := range []string{"Allow", "Reserve"} {
		t.Run(via, func(t *testing.T) {
			checks := []ratebudget.Check{
				{Rule: slots, Identity: "uma-" + via, Cost: 1},
				{Rule: ratebudget.Rule{Name: "api", Limit: 100, Window: time.Minute}, Identity: "uma-" + via, Cost: 1},
			}
			key := l.Key(checks[0])
			hook.armed.Store(true)
			var err error
			if via == "Allow" {
				_, err = l.Allow(ctx, checks)
			} else {
				_, err = l.Reserve(ctx, checks, make([]ratebudget.Ticket, 2), nil)
			}
			var se *ratebudget.StoreError
			if !errors.As(err, &se) || !se.Uncertain {
				t.Fatalf("decision with its reply lost: %v, want an uncertain store error", err)
			}
			select {
			case <-hook.settled:
			case <-time.After(10 * time.Second): // bounds the test, not a timing assertion
				n, _ := client.ZCard(ctx, key).Result()
				t.Fatalf("no release sent within 10s; %d leases held", n)
			}
			if n, err := client.ZCard(ctx, key).Result(); err != nil || n != 0 {
				t.Fatalf("leases held after the release: %d, %v; want 0", n, err)
			}
			if d, err := l.Allow(ctx, checks[:1]); err != nil || !d.Allowed {
				t.Fatalf("next request: %+v, %v; want admitted", d, err)
			}
		})
	}
}
