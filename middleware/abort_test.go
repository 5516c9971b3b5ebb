package middleware_test

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/middleware"
)

// A client that goes away in the middle of a response body is charged by
// CountSuccesses as the status it was sent says, whether the handler writes the body
// itself (its writes fail and it returns) or is an httputil.ReverseProxy (which then
// panics with http.ErrAbortHandler): a client must not escape the charge of a response
// by resetting the connection before its last byte.
func TestClientGoneMidBodyIsCharged(t *testing.T) {
	t.Parallel()
	chunk := strings.Repeat("z", 64<<10)
	writer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
		}
	})
	backend := httptest.NewServer(writer)
	t.Cleanup(backend.Close)
	u, _ := url.Parse(backend.URL)
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.ErrorLog = log.New(io.Discard, "", 0)
	protos(t, func(t *testing.T, h2 bool) {
		for _, c := range []struct {
			name string
			h    http.Handler
		}{{"handler", writer}, {"ReverseProxy", proxy}} {
			lim := newMemory(t, newClock())
			okRule := rule("ok", 10, time.Minute)
			limit := mustNew(t, lim, []middleware.Rule{{Rule: okRule, Identity: global, Counts: middleware.CountSuccesses(nil)}})
			url, client, served := realServer(t, limit(c.h), h2)
			leaveMidBody(t, client, url, served, 256<<10)
			if n := spent(t, lim, okRule); n != 1 {
				t.Errorf("%s: %d charged for a 200 whose client went away mid-body, want 1", c.name, n)
			}
		}
	})
}
