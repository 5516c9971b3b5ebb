package lua_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

var prefixSeq atomic.Int64

func uniquePrefix(t *testing.T) string {
	return fmt.Sprintf("rbtest%d-%d", time.Now().UnixNano(), prefixSeq.Add(1))
}

// newLimiter returns a limiter on c under a prefix of its own.
func newLimiter(t *testing.T, c redis.Scripter, opts ...lua.Option) *lua.Limiter {
	t.Helper()
	l, err := lua.New(c, append([]lua.Option{lua.WithPrefix(uniquePrefix(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// lua.Limiter resets budgets, settles decisions and reports every check's outcome, so
// the suite's cases of each run rather than skip.
var (
	_ limitertest.Resetter = (*lua.Limiter)(nil)
	_ limitertest.Settler  = (*lua.Limiter)(nil)
	_ limitertest.Reporter = (*lua.Limiter)(nil)
)

// TestConformanceProcess runs the shared suite against a private redis-server process.
// The integration tests run it again against a container.
func TestConformanceProcess(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	limitertest.Run(t, func(t *testing.T) limitertest.Harness {
		l := newLimiter(t, client)
		return limitertest.Harness{Limiter: l}
	})
}

func TestNewValidatesOptions(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer c.Close()
	cases := []struct {
		name  string
		field string
		opts  []lua.Option
	}{
		{"empty prefix", "WithPrefix", []lua.Option{lua.WithPrefix("")}},
		{"brace prefix", "WithPrefix", []lua.Option{lua.WithPrefix("a{b")}},
		{"space prefix", "WithPrefix", []lua.Option{lua.WithPrefix("a b")}},
		{"long prefix", "WithPrefix", []lua.Option{lua.WithPrefix(strings.Repeat("p", 65))}},
		{"nil option", "options", []lua.Option{nil}},
		{"negative refusal cache", "WithRefusalCache", []lua.Option{lua.WithRefusalCache(-1)}},
		{"huge refusal cache", "WithRefusalCache", []lua.Option{lua.WithRefusalCache(1<<24 + 1)}},
		{"short key secret", "WithKeySecret", []lua.Option{lua.WithKeySecret([]byte("fifteen bytes!!"))}},
		{"long key secret", "WithKeySecret", []lua.Option{lua.WithKeySecret(make([]byte, 1025))}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := lua.New(c, tc.opts...)
			var ce *ratebudget.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("New: %v, want a ConfigError naming %s", err, tc.field)
			}
		})
	}
	if _, err := lua.New(nil); !limitertest.IsConfigError(err) {
		t.Fatalf("New(nil) = %v, want a ConfigError", err)
	}
	if _, err := lua.New((*redis.Client)(nil)); !limitertest.IsConfigError(err) {
		t.Fatalf("New of a nil *redis.Client = %v, want a ConfigError", err)
	}
	if _, err := lua.New(c, lua.WithRefusalCache(10), lua.WithRefusalCache(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := lua.New(c, lua.WithPrefix("app:v1"), lua.WithKeySecret(make([]byte, 16)), lua.WithRefusalCache(1<<24)); err != nil {
		t.Fatal(err)
	}
}

// TestNewRefusesClients: a client whose socket reads ignore the context's deadline, and
// a *redis.Ring (which shards keys by its own hash, not by hash slot), are refused with a
// ConfigError naming the field at fault.
func TestNewRefusesClients(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client redis.Scripter
		field  string
	}{
		{"client without ContextTimeoutEnabled", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "ContextTimeoutEnabled"},
		{"cluster without ContextTimeoutEnabled", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), "ContextTimeoutEnabled"},
		{"failover client without ContextTimeoutEnabled", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}}), "ContextTimeoutEnabled"},
		{"ring", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1", "b": "127.0.0.1:2"}, ContextTimeoutEnabled: true}), "client"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer tc.client.(interface{ Close() error }).Close()
			_, err := lua.New(tc.client)
			var ce *ratebudget.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("New: %v, want a ConfigError naming %s", err, tc.field)
			}
		})
	}
}

// TestStoreErrors: failures are *ratebudget.StoreError with a class, never a decision.
func TestStoreErrors(t *testing.T) {
	chk := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "api", Limit: 1, Window: time.Second}, Cost: 1}}

	t.Run("dial refused", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second, ContextTimeoutEnabled: true})
		defer c.Close()
		l, _ := lua.New(c)
		_, err := l.Allow(context.Background(), chk)
		var se *ratebudget.StoreError
		if !errors.As(err, &se) || se.Class != ratebudget.ClassConnection || se.Uncertain {
			t.Fatalf("Allow = %v, want a certain connection StoreError", err)
		}
	})
	t.Run("canceled before sending", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
		defer c.Close()
		l, _ := lua.New(c)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := l.Allow(ctx, chk)
		var se *ratebudget.StoreError
		if !errors.As(err, &se) || se.Class != ratebudget.ClassCanceled || se.Uncertain {
			t.Fatalf("Allow = %v, want a certain canceled StoreError", err)
		}
	})
	t.Run("server error", func(t *testing.T) {
		srv := redistest.Start(t)
		c := srv.Client(t)
		l, _ := lua.New(c, lua.WithPrefix(uniquePrefix(t)))
		key := l.Key(chk[0])
		// A key of the wrong type makes the script fail before it writes.
		if err := c.LPush(context.Background(), key, "x").Err(); err != nil {
			t.Fatal(err)
		}
		_, err := l.Allow(context.Background(), chk)
		var se *ratebudget.StoreError
		if !errors.As(err, &se) || se.Class != ratebudget.ClassServer || se.Uncertain {
			t.Fatalf("Allow = %v, want a certain server StoreError", err)
		}
	})
	t.Run("client closed", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
		c.Close()
		l, _ := lua.New(c)
		_, err := l.Allow(context.Background(), chk)
		if !errors.Is(err, ratebudget.ErrStoreUnavailable) {
			t.Fatalf("Allow = %v, want a StoreError", err)
		}
	})
}

// fakeScripter answers every script with a fixed reply, to test reply checking.
type fakeScripter struct {
	redis.Scripter
	reply any
}

func (f fakeScripter) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetVal(f.reply)
	return cmd
}

func TestBadReplies(t *testing.T) {
	chk := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "api", Limit: 1, Window: time.Second}, Cost: 1}}
	for _, reply := range []any{
		nil, "OK", int64(1), []any{}, []any{int64(1)},
		[]any{int64(1), int64(0), int64(0), int64(1), int64(0), "x"},
		[]any{int64(1), int64(1), int64(0), int64(1), int64(0), int64(0)},
		[]any{int64(2), int64(0), int64(0), int64(1), int64(0), int64(0)},
		[]any{int64(1), int64(0), int64(0), int64(-1), int64(0), int64(0)},
	} {
		l, _ := lua.New(fakeScripter{reply: reply})
		_, err := l.Allow(context.Background(), chk)
		var se *ratebudget.StoreError
		if !errors.As(err, &se) || se.Class != ratebudget.ClassReply {
			t.Errorf("reply %#v: Allow = %v, want a reply StoreError", reply, err)
		}
	}
	l, _ := lua.New(fakeScripter{reply: []any{int64(1), int64(0), int64(0), int64(1000), int64(0), int64(0)}})
	d, err := l.Allow(context.Background(), chk)
	if err != nil || !d.Allowed || d.ResetAfter != time.Second {
		t.Fatalf("well-formed reply: %+v, %v", d, err)
	}
}
