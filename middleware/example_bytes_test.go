package middleware_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// An upload endpoint with a byte budget: each request is charged its body's
// Content-Length before the handler runs, a body larger than what is left is refused
// with 429, and one larger than the whole budget with 413 (decided before the limiter
// is asked, so without metadata); a refused body is not charged.
func ExampleCountRequestBytes() {
	lim, _ := memory.New()
	limit, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "uploads", Limit: 1000, Window: time.Minute}, // bytes
		Identity: keyfuncs.Global(),
		Counts:   middleware.CountRequestBytes(),
	}})
	if err != nil {
		panic(err)
	}
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
	}))
	for _, size := range []int{600, 600, 2000, 400} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/upload", strings.NewReader(strings.Repeat("x", size))))
		fmt.Printf("%d bytes: %d remaining=%s\n", size, rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 600 bytes: 200 remaining=400
	// 600 bytes: 429 remaining=400
	// 2000 bytes: 413 remaining=
	// 400 bytes: 200 remaining=0
}

// A download endpoint charged the bytes it writes: 100 bytes are reserved at admission
// (what the metadata reports), and the request is settled at what the handler wrote.
// The third is admitted with 200 left; its 400 bytes put the budget 200 into debt, so
// the fourth is refused.
func ExampleCountResponseBytes() {
	lim, _ := memory.New()
	limit, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "downloads", Limit: 1000, Window: time.Minute}, // bytes
		Identity: keyfuncs.Global(),
		Counts:   middleware.CountResponseBytes(100),
	}})
	if err != nil {
		panic(err)
	}
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("size"))
		w.Write([]byte(strings.Repeat("x", n)))
	}))
	for range 4 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/download?size=400", nil))
		fmt.Printf("%d remaining=%s\n", rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 200 remaining=900
	// 200 remaining=500
	// 200 remaining=100
	// 429 remaining=0
}
