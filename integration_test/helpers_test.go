package integration_test

import (
	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/budgetkey"
	"github.com/ratebudget/ratebudget/lua"
)

// luaNew is the limiter under test: every decision goes to Redis (no refusal cache),
// since these tests change budgets on the server behind the limiter's back.
func luaNew(c redis.Scripter, prefix string, more ...lua.Option) (*lua.Limiter, error) {
	return lua.New(c, append([]lua.Option{lua.WithPrefix(prefix), lua.WithRefusalCache(0)}, more...)...)
}

// keyOf is the key of ch's budget for a limiter of prefix (and no key secret).
func keyOf(prefix string, ch ratebudget.Check) string {
	return budgetkey.New(prefix, nil).Key(ch)
}
