package integration_test

import (
	"github.com/redis/go-redis/v9"

	"testing"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/lua"
)

// luaNew is the limiter under test: every decision goes to Redis (no refusal cache),
// since these tests change budgets on the server behind the limiter's back.
func luaNew(c redis.Scripter, prefix string, more ...lua.Option) (*lua.Limiter, error) {
	return lua.New(c, append([]lua.Option{lua.WithPrefix(prefix), lua.WithRefusalCache(0)}, more...)...)
}

// keyOf is the key of ch under prefix.
func keyOf(t *testing.T, prefix string, ch ratebudget.Check) string {
	t.Helper()
	l, err := lua.New(nopClient{}, lua.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	return l.Key(ch)
}

// nopClient is never called: it only lets keyOf build a limiter.
type nopClient struct{ redis.Scripter }
