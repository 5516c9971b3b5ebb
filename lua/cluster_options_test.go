package lua_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/lua"
)

// New refuses a ClusterClient that would return MOVED instead of following it, naming
// the option; the default and any positive MaxRedirects are accepted.
func TestClusterMaxRedirects(t *testing.T) {
	for _, tc := range []struct {
		redirects int
		ok        bool
	}{{-1, false}, {0, true}, {1, true}, {8, true}} {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true, MaxRedirects: tc.redirects})
		_, err := lua.New(c)
		c.Close()
		var ce *ratebudget.ConfigError
		if tc.ok && err != nil {
			t.Errorf("MaxRedirects %d: %v", tc.redirects, err)
		}
		if !tc.ok && (!errors.As(err, &ce) || ce.Field != "MaxRedirects") {
			t.Errorf("MaxRedirects %d: %v, want a ConfigError naming MaxRedirects", tc.redirects, err)
		}
	}
}

// Which errors make the limiter reload a ClusterClient's slot map: those that may mean
// a master died, stalled or moved, never a script's own error or a refusal.
func TestTopologyError(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	for err, want := range map[error]bool{
		refused:                                true,
		reset:                                  true,
		io.EOF:                                 true,
		context.DeadlineExceeded:               true,
		fmt.Errorf("x: %w", reset):             true,
		redis.ErrClosed:                        false,
		context.Canceled:                       false,
		errors.New("ERR Error running script"): false,
		errors.New("OOM command not allowed"):  false,
	} {
		if got := lua.TopologyError(err); got != want {
			t.Errorf("%v: %v, want %v", err, got, want)
		}
	}
}
