package middleware_test

import (
	"testing"

	"github.com/ratebudget/ratebudget/middleware"
)

// The results are their metric labels (the metrics collector and the log use them per
// decision, as they are, without converting them).
func TestResultLabels(t *testing.T) {
	for _, tc := range []struct {
		v    middleware.Result
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
	} {
		if string(tc.v) != tc.want {
			t.Errorf("result %q, want %q", tc.v, tc.want)
		}
	}
}
