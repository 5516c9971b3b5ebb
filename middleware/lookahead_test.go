package middleware_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
)

// A top-level r.Use layer looks ahead to the route chi runs. A route or mount whose
// pattern merely starts with the same characters as a mount's is not inside that mount:
// the mount's layers do not run for it, and the outer layer must decide before the
// handler runs (a 429 once its budget is spent, and no mounting-mistake line).
func TestLookAheadPastAMountSharingAPrefix(t *testing.T) {
	var logged strings.Builder
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	for _, tc := range []struct {
		name, target string
		mount        func(r chi.Router, inner func(http.Handler) http.Handler)
	}{
		{"route after a subrouter", "/apikeys", func(r chi.Router, inner func(http.Handler) http.Handler) {
			r.Route("/api", func(r chi.Router) {
				r.Use(inner)
				r.Get("/", ok)
			})
			r.Get("/apikeys", ok)
		}},
		{"subrouter after a subrouter", "/apikeys/", func(r chi.Router, inner func(http.Handler) http.Handler) {
			r.Route("/api", func(r chi.Router) {
				r.Use(inner)
				r.Get("/", ok)
			})
			r.Route("/apikeys", func(r chi.Router) { r.Get("/", ok) })
		}},
		{"route after With before Mount", "/apikeys", func(r chi.Router, inner func(http.Handler) http.Handler) {
			sub := chi.NewRouter()
			sub.Get("/", ok)
			r.With(inner).Mount("/api", sub)
			r.Get("/apikeys", ok)
		}},
		{"mount of a plain handler after a subrouter", "/apikeys/x", func(r chi.Router, inner func(http.Handler) http.Handler) {
			r.Route("/api", func(r chi.Router) {
				r.Use(inner)
				r.Get("/", ok)
			})
			r.Mount("/apikeys", ok)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logged.Reset()
			lim := memory(t, newClock())
			outer, inner, _ := layers(t, lim, false)
			r := chi.NewRouter()
			r.Use(outer)
			tc.mount(r, inner)
			alice := map[string]string{"X-Client": "alice"}
			if rec := do(r, "GET", tc.target, alice); rec.Code != 200 || rec.Header().Get("X-RateLimit-Limit") != "5" {
				t.Errorf("first: %d %v, want 200 with outer's metadata", rec.Code, rec.Header())
			}
			for range 4 {
				do(r, "GET", tc.target, alice)
			}
			if rec := do(r, "GET", tc.target, alice); rec.Code != 429 {
				t.Errorf("outer exhausted: %d, want 429", rec.Code)
			}
			if n := left(t, lim, outerRule, "alice"); n != 0 {
				t.Errorf("outer has %d left after 5 admitted, want 0", n)
			}
			if n := left(t, lim, innerRule, "alice"); n != 1 {
				t.Errorf("inner has %d left, want 1 (it is not on %s)", n, tc.target)
			}
			if strings.Contains(logged.String(), "handed its checks") {
				t.Errorf("logged a mounting mistake for a correct mounting:\n%s", logged.String())
			}
		})
	}
}
