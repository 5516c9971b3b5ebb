package integration_test

import (
	"testing"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/lua"
)

func luaNew(c lua.Client, prefix string) (*lua.Limiter, error) {
	return lua.New(c, lua.WithPrefix(prefix))
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
type nopClient struct{ lua.Client }
