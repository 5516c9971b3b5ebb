package headers_test

import (
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/ratebudget/ratebudget/headers"
)

// A custom refusal handler can reuse the 429 writer: Retry-After rounded up to whole
// seconds, Cache-Control: no-store, metadata, and a body fit for the client.
func ExampleWriteTooManyRequests() {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/api/hello", nil)
	headers.WriteTooManyRequests(rec, req, headers.Both, []headers.Info{{
		Policy: "hello", Limit: 10, Remaining: 0,
		Reset: 41500 * time.Millisecond, Window: time.Minute, RetryAfter: 41500 * time.Millisecond,
		Available: 41500 * time.Millisecond, // a fixed window: more quota comes when it ends
	}}, 0)
	fmt.Println(rec.Code)
	for _, h := range []string{"Retry-After", "Cache-Control", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"} {
		fmt.Printf("%s: %s\n", h, rec.Header().Get(h))
	}
	fmt.Print(rec.Body.String())
	// Output:
	// 429
	// Retry-After: 42
	// Cache-Control: no-store
	// X-RateLimit-Limit: 10
	// X-RateLimit-Remaining: 0
	// X-RateLimit-Reset: 42
	// RateLimit-Policy: "hello";q=10;w=60
	// RateLimit: "hello";r=0;t=41
	// Too Many Requests: rate limit "hello" exhausted; retry in 42s
}
