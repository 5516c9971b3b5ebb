package lua_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// Ping answers nil from a server that answers, a connection StoreError from one that is
// gone, and dials on a connection of its own: the client's pool opens none for it, so
// its failed dials never count toward the pool's dial circuit.
func TestPingOwnConnection(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	l, err := lua.New(c, lua.WithPrefix("ping"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Ping(ctx); err != nil {
		t.Fatalf("Ping of a live server: %v", err)
	}
	if got := c.PoolStats().TotalConns; got != 0 {
		t.Fatalf("the client's pool holds %d connections after Ping, want 0", got)
	}
	if n := srv.Calls(t, "ping"); n != 1 {
		t.Fatalf("server saw %d PINGs, want 1", n)
	}
	srv.Kill(t)
	for range 50 {
		err := l.Ping(ctx)
		var se *ratebudget.StoreError
		if !errors.As(err, &se) || se.Class != ratebudget.ClassConnection {
			t.Fatalf("Ping of a stopped server: %v, want a connection StoreError", err)
		}
	}
	srv.Restart(t)
	if err := l.Ping(ctx); err != nil {
		t.Fatalf("Ping after a restart: %v", err)
	}
	// 50 failed pings would have put a pool of PoolSize 20 into its dial circuit; the
	// client's pool saw none of them.
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("the client after the failed pings: %v", err)
	}
}
