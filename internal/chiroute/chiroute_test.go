package chiroute_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/ratebudget/ratebudget/internal/chiroute"
)

func mark(next http.Handler) http.Handler { return next }
func other(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { next.ServeHTTP(w, r) })
}

// seen records, at the last r.Use of a router, what the look-ahead finds.
type seen struct {
	probe   chiroute.Probe
	cache   chiroute.Cache
	routing bool
	pattern string
	firstMW uintptr
	firstH  http.Handler
	ok      bool
}

func (s *seen) mw(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.routing = s.probe.IsRouting(next)
		if mux, method, path := s.cache.Level(r); mux != nil {
			var levels []string
			s.pattern, levels = chiroute.Find(mux, method, path)
			var mw func(http.Handler) http.Handler
			mw, s.firstH, s.ok = s.cache.First(mux, method, s.pattern, levels)
			s.firstMW = chiroute.FuncPC(mw)
		}
		next.ServeHTTP(w, r)
	})
}

func TestLookAhead(t *testing.T) {
	t.Parallel()
	endpoint := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, tc := range []struct {
		name    string
		build   func(s *seen) http.Handler
		target  string
		pattern string
		firstMW uintptr
		ok      bool
	}{
		{"with on route", func(s *seen) http.Handler {
			r := chi.NewRouter()
			r.Use(s.mw)
			r.With(mark, other).Get("/x/{id}", endpoint)
			return r
		}, "/x/1", "/x/{id}", chiroute.FuncPC(mark), true},
		{"subrouter use", func(s *seen) http.Handler {
			r := chi.NewRouter()
			r.Use(s.mw)
			r.Route("/api", func(r chi.Router) {
				r.Use(other)
				r.Get("/y", endpoint)
			})
			return r
		}, "/api/y", "/api/y", chiroute.FuncPC(other), true},
		{"subrouter without middlewares, route with", func(s *seen) http.Handler {
			r := chi.NewRouter()
			r.Use(s.mw)
			r.Route("/api", func(r chi.Router) { r.With(mark).Get("/y", endpoint) })
			return r
		}, "/api/y", "/api/y", chiroute.FuncPC(mark), true},
		{"route sharing a subrouter's prefix", func(s *seen) http.Handler {
			r := chi.NewRouter()
			r.Use(s.mw)
			r.Route("/api", func(r chi.Router) {
				r.Use(other)
				r.Get("/", endpoint)
			})
			r.Get("/apikeys", endpoint)
			return r
		}, "/apikeys", "/apikeys", 0, true},
		{"404 in a subrouter", func(s *seen) http.Handler {
			r := chi.NewRouter()
			r.Use(s.mw)
			r.Route("/api", func(r chi.Router) {
				r.Use(other)
				r.Get("/y", endpoint)
			})
			return r
		}, "/api/nowhere", "", chiroute.FuncPC(other), true},
		{"plain route", func(s *seen) http.Handler {
			r := chi.NewRouter()
			r.Use(s.mw)
			r.Get("/z", endpoint)
			return r
		}, "/z", "/z", 0, true},
		{"no route", func(s *seen) http.Handler {
			r := chi.NewRouter()
			r.Use(s.mw)
			r.Get("/z", endpoint)
			return r
		}, "/nowhere", "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &seen{probe: chiroute.NewProbe()}
			h := tc.build(s)
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", tc.target, nil))
			if !s.routing {
				t.Error("the last r.Use's next is not recognised as chi's routing step")
			}
			if s.pattern != tc.pattern || s.firstMW != tc.firstMW || s.ok != tc.ok {
				t.Errorf("pattern %q first %x ok %v, want %q %x %v", s.pattern, s.firstMW, s.ok, tc.pattern, tc.firstMW, tc.ok)
			}
			if tc.ok && tc.firstMW == 0 && s.firstH == nil {
				t.Error("no endpoint handler")
			}
		})
	}
	p := chiroute.NewProbe()
	if p.IsRouting(endpoint) || p.IsRouting(http.NotFoundHandler()) {
		t.Error("another handler taken for chi's routing step")
	}
}
