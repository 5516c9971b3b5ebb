package middleware_test

import (
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	chimw "github.com/go-chi/chi/v5/middleware"

	"github.com/ratebudget/ratebudget/middleware"
)

// waitDeadline is a handler that works until its request's context ends and returns
// without answering, as a handler under a timeout middleware does.
var waitDeadline = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })

// A request whose deadline (chi's middleware.Timeout, http.TimeoutHandler) passes while
// its handler runs is answered 504 or 503, a server failure: CountSuccesses(nil) does not
// charge it, whether the timeout middleware is outside the limiting one or inside it.
// Outside, the middleware sees only that the handler returned without answering after
// its deadline passed, or that its writes failed with http.ErrHandlerTimeout.
func TestCountSuccessesUnderTimeouts(t *testing.T) {
	t.Parallel()
	writeLate := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		// TimeoutHandler answers once it sees the deadline too: from then on, writes fail.
		for {
			_, err := io.WriteString(w, "too late")
			if err != nil {
				if !errors.Is(err, http.ErrHandlerTimeout) {
					t.Errorf("late write: %v, want http.ErrHandlerTimeout", err)
				}
				return
			}
		}
	})
	const short = 20 * time.Millisecond // only the handler waits for it
	type mw = func(http.Handler) http.Handler
	for _, c := range []struct {
		name   string
		build  func(limit mw) http.Handler
		status int
	}{
		{"chi Timeout outside", func(limit mw) http.Handler { return chimw.Timeout(short)(limit(waitDeadline)) }, 504},
		{"chi Timeout inside", func(limit mw) http.Handler { return limit(chimw.Timeout(short)(waitDeadline)) }, 504},
		{"TimeoutHandler outside, nothing written", func(limit mw) http.Handler { return http.TimeoutHandler(limit(waitDeadline), short, "") }, 503},
		{"TimeoutHandler outside, written late", func(limit mw) http.Handler { return http.TimeoutHandler(limit(writeLate), short, "") }, 503},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			protos(t, func(t *testing.T, h2 bool) {
				lim := newMemory(t, newClock())
				okRule := rule("ok", 10, time.Minute)
				limit := mustNew(t, lim, []middleware.Rule{{Rule: okRule, Identity: global, Counts: middleware.CountSuccesses(nil)}})
				// TimeoutHandler returns when it answers, while the middleware inside it
				// runs on: wait for the middleware itself to return, settled.
				settled := make(chan struct{}, 1)
				signal := func(next http.Handler) http.Handler {
					l := limit(next)
					return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						defer func() { settled <- struct{}{} }()
						l.ServeHTTP(w, r)
					})
				}
				url, client, _ := realServer(t, c.build(signal), h2)
				req, _ := http.NewRequest("GET", url, nil)
				code, _ := fetch(t, client, req, h2)
				<-settled
				if code != c.status {
					t.Fatalf("status %d, want %d", code, c.status)
				}
				if n := spent(t, lim, okRule); n != 0 {
					t.Errorf("%d charged for a request answered %d, want 0", n, code)
				}
			})
		})
	}
}
