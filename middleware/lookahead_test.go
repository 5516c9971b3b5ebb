package middleware_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
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
			lim := newMemory(t, newClock())
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

// Every way of reaching a route that starts with a layer behind a top-level r.Use layer:
// one decision, each budget spent once, a refusal by the inner layer spends nothing, and
// no mounting-mistake line.
func TestLookAheadMatrix(t *testing.T) {
	var logged strings.Builder
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	sub := func(r chi.Router, inner func(http.Handler) http.Handler) {
		r.Route("/api", func(r chi.Router) {
			r.Use(inner)
			r.Get("/", ok)
			r.Get("/y", ok)
		})
	}
	for _, tc := range []struct {
		name, method, target string
		code                 int
		before               []func(http.Handler) http.Handler
		mount                func(r chi.Router, inner func(http.Handler) http.Handler)
	}{
		{"subrouter, its own path", "GET", "/api", 200, nil, sub},
		{"subrouter, its own path with a slash", "GET", "/api/", 200, nil, sub},
		{"subrouter route", "GET", "/api/y", 200, nil, sub},
		{"nested subrouters, regexp param", "GET", "/a/b/42", 200, nil, func(r chi.Router, inner func(http.Handler) http.Handler) {
			r.Route("/a", func(r chi.Router) {
				r.Route("/b", func(r chi.Router) {
					r.Use(inner)
					r.Get("/{id:[0-9]+}", ok)
				})
			})
		}},
		{"nested subrouters without middlewares, with on route", "GET", "/a/b/42", 200, nil, func(r chi.Router, inner func(http.Handler) http.Handler) {
			r.Route("/a", func(r chi.Router) {
				r.Route("/b", func(r chi.Router) { r.With(inner).Get("/{id:[0-9]+}", ok) })
			})
		}},
		{"with before mount", "GET", "/m/y", 200, nil, func(r chi.Router, inner func(http.Handler) http.Handler) {
			s := chi.NewRouter()
			s.Get("/y", ok)
			r.With(inner).Mount("/m", s)
		}},
		{"wildcard route", "GET", "/files/a/b", 200, nil, func(r chi.Router, inner func(http.Handler) http.Handler) {
			r.With(inner).Get("/files/*", ok)
		}},
		{"encoded path", "GET", "/files/a%2Fb", 200, nil, func(r chi.Router, inner func(http.Handler) http.Handler) {
			r.With(inner).Get("/files/{name}", ok)
		}},
		{"group with, then with", "GET", "/x", 200, nil, func(r chi.Router, inner func(http.Handler) http.Handler) {
			r.Group(func(r chi.Router) {
				r.With(inner).With(func(next http.Handler) http.Handler { return next }).Get("/x", ok)
			})
		}},
		{"GetHead", "HEAD", "/x", 200, []func(http.Handler) http.Handler{chimw.GetHead}, func(r chi.Router, inner func(http.Handler) http.Handler) {
			r.With(inner).Get("/x", ok)
		}},
		{"StripSlashes", "GET", "/x/", 200, []func(http.Handler) http.Handler{chimw.StripSlashes}, func(r chi.Router, inner func(http.Handler) http.Handler) {
			r.With(inner).Get("/x", ok)
		}},
		{"CleanPath", "GET", "/a//x", 200, []func(http.Handler) http.Handler{chimw.CleanPath}, func(r chi.Router, inner func(http.Handler) http.Handler) {
			r.With(inner).Get("/a/x", ok)
		}},
		{"URLFormat", "GET", "/x.json", 200, []func(http.Handler) http.Handler{chimw.URLFormat}, func(r chi.Router, inner func(http.Handler) http.Handler) {
			r.With(inner).Get("/x", ok)
		}},
		{"OPTIONS route", "OPTIONS", "/x", 200, nil, func(r chi.Router, inner func(http.Handler) http.Handler) {
			r.With(inner).Options("/x", ok)
			r.Get("/x", ok)
		}},
		{"subrouter 404", "GET", "/api/nowhere", 404, nil, sub},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logged.Reset()
			lim := newMemory(t, newClock())
			outer, inner, _ := layers(t, lim, false)
			r := chi.NewRouter()
			r.Use(tc.before...)
			r.Use(outer)
			tc.mount(r, inner)
			alice := map[string]string{"X-Client": "alice"}
			if rec := do(r, tc.method, tc.target, alice); rec.Code != tc.code || rec.Header().Get("X-RateLimit-Limit") != "1" {
				t.Errorf("first: %d %v, want %d with inner's metadata", rec.Code, rec.Header(), tc.code)
			}
			if rec := do(r, tc.method, tc.target, alice); rec.Code != 429 {
				t.Errorf("inner exhausted: %d, want 429", rec.Code)
			}
			if n := left(t, lim, outerRule, "alice"); n != 4 {
				t.Errorf("outer has %d left after 1 admitted and 1 refused, want 4", n)
			}
			if n := left(t, lim, innerRule, "alice"); n != 0 {
				t.Errorf("inner has %d left, want 0", n)
			}
			if strings.Contains(logged.String(), "handed its checks") {
				t.Errorf("logged a mounting mistake for a correct mounting:\n%s", logged.String())
			}
		})
	}
}
