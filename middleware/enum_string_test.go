package middleware_test

import (
	"fmt"
	"testing"

	"github.com/ratebudget/ratebudget/middleware"
)

// The enums' String methods: every named value has its label, without allocating (the
// metrics collector and the log use them per decision), and a value outside the named
// ones says its type and number, as ratebudget.Algorithm's does.
func TestEnumStrings(t *testing.T) {
	cases := []struct {
		v    fmt.Stringer
		want string
	}{
		{middleware.Allowed, "allowed"},
		{middleware.Denied, "denied"},
		{middleware.Exceeded, "exceeded"},
		{middleware.Degraded, "degraded"},
		{middleware.Unavailable, "unavailable"},
		{middleware.Invalid, "invalid"},
		{middleware.Canceled, "canceled"},
		{middleware.SettleFailed, "settle_failed"},
		{middleware.Result(8), "Result(8)"},
		{middleware.Result(42), "Result(42)"},
		{middleware.Result(255), "Result(255)"},
	}
	for _, tc := range cases {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("%T(%d).String() = %q, want %q", tc.v, tc.v, got, tc.want)
		}
		if tc.want[len(tc.want)-1] == ')' {
			continue
		}
		v := tc.v
		if n := testing.AllocsPerRun(100, func() { _ = v.String() }); n != 0 {
			t.Errorf("%T(%d).String() allocates %v times, want 0", tc.v, tc.v, n)
		}
	}
}
