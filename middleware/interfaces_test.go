package middleware

import (
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/memory"
)

// The limiters of the module settle and report every check's outcome through the
// interfaces the middleware looks for, and those are the conformance suite's, which the
// tests of package middleware_test use.
var (
	_ settler  = (*memory.Limiter)(nil)
	_ reporter = (*memory.Limiter)(nil)
	_ settler  = (*lua.Limiter)(nil)
	_ reporter = (*lua.Limiter)(nil)

	_ settler             = limitertest.Settler(nil)
	_ limitertest.Settler = settler(nil)
	_ reporter            = limitertest.Reporter(nil)
)
