package headers_test

import (
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
)

// A custom refusal handler (middleware.WithRefusalHandler) can log, then answer as the
// default does: Retry-After rounded up to whole seconds, Cache-Control: no-store, and a
// body fit for the client. The middleware has set the budget metadata before it calls the
// handler.
func ExampleWriteTooManyRequests() {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/api/hello", nil)
	d := ratebudget.Decision{Rule: "hello", Limit: 10,
		Outcome: ratebudget.Outcome{ResetAfter: 41500 * time.Millisecond, RetryAfter: 41500 * time.Millisecond}}
	headers.WriteTooManyRequests(rec, req, d)
	fmt.Println(rec.Code)
	for _, h := range []string{"Retry-After", "Cache-Control"} {
		fmt.Printf("%s: %s\n", h, rec.Header().Get(h))
	}
	fmt.Print(rec.Body.String())
	// Output:
	// 429
	// Retry-After: 42
	// Cache-Control: no-store
	// Too Many Requests: rate limit "hello" exhausted; retry in 42s
}
