package keyfuncs_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"

	"github.com/ratebudget/ratebudget/internal/keyreason"
	"github.com/ratebudget/ratebudget/internal/routekey"
	"github.com/ratebudget/ratebudget/keyfuncs"
)

// recorder is a middleware that records what a key function returns where it is installed.
type recorder struct {
	fn  keyFunc
	got string
	err error
	ran bool
}

func (rec *recorder) mw(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.got, rec.err = rec.fn(r)
		rec.ran = true
		next.ServeHTTP(w, r)
	})
}

func ok(w http.ResponseWriter, r *http.Request) {}

func serve(h http.Handler, method, target string) {
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(method, target, nil))
}

func checkRec(t *testing.T, rec *recorder, want string, wantErr error) {
	t.Helper()
	if !rec.ran {
		t.Fatal("middleware did not run")
	}
	if wantErr != nil {
		if !errors.Is(rec.err, wantErr) || rec.got != "" {
			t.Fatalf("got (%q, %v), want %v", rec.got, rec.err, wantErr)
		}
		return
	}
	if rec.err != nil || rec.got != want {
		t.Fatalf("got (%q, %v), want %q", rec.got, rec.err, want)
	}
}

func TestRoutePattern_Chi(t *testing.T) {
	t.Parallel()
	tt := []struct {
		name    string
		build   func(mw func(http.Handler) http.Handler) http.Handler
		target  string
		want    string
		wantErr error
	}{
		{
			name: "top_level_use_before_routing",
			build: func(mw func(http.Handler) http.Handler) http.Handler {
				r := chi.NewRouter()
				r.Use(mw)
				r.Get("/users/{id}", ok)
				return r
			},
			target: "/users/42", want: "/users/{id}", // looked up ahead of routing
		},
		{
			name: "top_level_use_through_a_subrouter",
			build: func(mw func(http.Handler) http.Handler) http.Handler {
				r := chi.NewRouter()
				r.Use(mw)
				r.Route("/api", func(r chi.Router) { r.Get("/users/{id}", ok) })
				return r
			},
			target: "/api/users/42", want: "/api/users/{id}",
		},
		{
			name: "top_level_use_no_route",
			build: func(mw func(http.Handler) http.Handler) http.Handler {
				r := chi.NewRouter()
				r.Use(mw)
				r.Get("/users/{id}", ok)
				return r
			},
			target: "/nowhere", want: routekey.Unmatched, // chi answers 404
		},
		{
			name: "with_on_route",
			build: func(mw func(http.Handler) http.Handler) http.Handler {
				r := chi.NewRouter()
				r.With(mw).Get("/users/{id}", ok)
				return r
			},
			target: "/users/42", want: "/users/{id}",
		},
		{
			name: "group_use",
			build: func(mw func(http.Handler) http.Handler) http.Handler {
				r := chi.NewRouter()
				r.Group(func(r chi.Router) {
					r.Use(mw)
					r.Get("/users/{id}", ok)
				})
				return r
			},
			target: "/users/42", want: "/users/{id}",
		},
		{
			name: "route_subrouter_use_sees_mount",
			build: func(mw func(http.Handler) http.Handler) http.Handler {
				r := chi.NewRouter()
				r.Route("/api", func(r chi.Router) {
					r.Use(mw)
					r.Get("/users/{id}", ok)
				})
				return r
			},
			target: "/api/users/42", want: "/api/*",
		},
		{
			name: "route_with_inside_subrouter",
			build: func(mw func(http.Handler) http.Handler) http.Handler {
				r := chi.NewRouter()
				r.Route("/api", func(r chi.Router) {
					r.With(mw).Get("/users/{id}", ok)
				})
				return r
			},
			target: "/api/users/42", want: "/api/users/{id}",
		},
		{
			name: "group_inside_nested_routes",
			build: func(mw func(http.Handler) http.Handler) http.Handler {
				r := chi.NewRouter()
				r.Route("/api", func(r chi.Router) {
					r.Route("/v1", func(r chi.Router) {
						r.Group(func(r chi.Router) {
							r.Use(mw)
							r.Post("/orders/{order}/items", ok)
						})
					})
				})
				return r
			},
			target: "/api/v1/orders/7/items", want: "/api/v1/orders/{order}/items",
		},
		{
			name: "mounted_router_use",
			build: func(mw func(http.Handler) http.Handler) http.Handler {
				sub := chi.NewRouter()
				sub.Use(mw)
				sub.Get("/{id}", ok)
				r := chi.NewRouter()
				r.Mount("/items", sub)
				return r
			},
			target: "/items/3", want: "/items/*",
		},
		{
			name: "catch_all_route",
			build: func(mw func(http.Handler) http.Handler) http.Handler {
				r := chi.NewRouter()
				r.With(mw).Get("/static/*", ok)
				return r
			},
			target: "/static/a/b.css", want: "/static/*",
		},
		{
			name: "root",
			build: func(mw func(http.Handler) http.Handler) http.Handler {
				r := chi.NewRouter()
				r.With(mw).Get("/", ok)
				return r
			},
			target: "/", want: "/",
		},
	}
	for _, tc := range tt {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{fn: keyfuncs.RoutePattern()}
			method := http.MethodGet
			if tc.name == "group_inside_nested_routes" {
				method = http.MethodPost
			}
			serve(tc.build(rec.mw), method, tc.target)
			checkRec(t, rec, tc.want, tc.wantErr)
		})
	}
}

func TestRoutePattern_ChiHandlerAfterRouting(t *testing.T) {
	t.Parallel()
	// In a handler (after routing) the full pattern is known, even in a subrouter.
	var got string
	var err error
	r := chi.NewRouter()
	r.Route("/api", func(r chi.Router) {
		r.Get("/users/{id}", func(w http.ResponseWriter, r *http.Request) {
			got, err = keyfuncs.RoutePattern()(r)
		})
	})
	serve(r, http.MethodGet, "/api/users/1")
	if err != nil || got != "/api/users/{id}" {
		t.Fatalf("got (%q, %v)", got, err)
	}
}

func TestRoutePattern_ServeMux(t *testing.T) {
	t.Parallel()
	tt := []struct {
		name, pattern, method, target, want string
		fn                                  keyFunc
		wrapMux                             bool
		wantErr                             error
	}{
		{name: "method_pattern", pattern: "GET /items/{id}", method: "GET", target: "/items/9", want: "/items/{id}", fn: keyfuncs.RoutePattern()},
		{name: "plain_pattern", pattern: "/items/{id}", method: "GET", target: "/items/9", want: "/items/{id}", fn: keyfuncs.RoutePattern()},
		{name: "host_kept", pattern: "example.com/items/", method: "GET", target: "http://example.com/items/x", want: "example.com/items/", fn: keyfuncs.RoutePattern()},
		{name: "method_and_pattern", pattern: "POST /items", method: "POST", target: "/items", want: "POST /items", fn: routekey.MethodAndPattern},
		{name: "head_on_get_route", pattern: "GET /items", method: "HEAD", target: "/items", want: "GET /items", fn: routekey.MethodAndPattern},
		{name: "invented_method", pattern: "/items", method: "BREW", target: "/items", want: "OTHER /items", fn: routekey.MethodAndPattern},
		{name: "outside_mux", pattern: "/items", method: "GET", target: "/items", wrapMux: true, wantErr: keyreason.ErrNoRoutePattern, fn: keyfuncs.RoutePattern()},
	}
	for _, tc := range tt {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{fn: tc.fn}
			mux := http.NewServeMux()
			var h http.Handler
			if tc.wrapMux {
				mux.HandleFunc(tc.pattern, ok)
				h = rec.mw(mux)
			} else {
				mux.Handle(tc.pattern, rec.mw(http.HandlerFunc(ok)))
				h = mux
			}
			serve(h, tc.method, tc.target)
			checkRec(t, rec, tc.want, tc.wantErr)
		})
	}
}

func TestMethodAndPattern_Chi(t *testing.T) {
	t.Parallel()
	rec := &recorder{fn: routekey.MethodAndPattern}
	r := chi.NewRouter()
	r.With(rec.mw).Delete("/users/{id}", ok)
	serve(r, http.MethodDelete, "/users/1")
	checkRec(t, rec, "DELETE /users/{id}", nil)

	rec = &recorder{fn: routekey.MethodAndPattern}
	r = chi.NewRouter()
	r.Use(rec.mw)
	r.Get("/", ok)
	serve(r, http.MethodGet, "/")
	checkRec(t, rec, "GET /", nil) // looked up ahead of routing

	// Outside any router nothing is known: an error, never a shared scope.
	rec = &recorder{fn: routekey.MethodAndPattern}
	serve(rec.mw(http.HandlerFunc(ok)), http.MethodGet, "/")
	checkRec(t, rec, "", keyreason.ErrNoRoutePattern)
}

// chi's GetHead middleware routes a HEAD request without a HEAD route to the GET route
// (rctx.RouteMethod = "GET"). The scope is then that GET route's, as for GET, wherever
// the key function runs after GetHead: not "~unmatched" before routing, and not a HEAD scope
// of its own (which would give a client a second budget by alternating HEAD and GET).
func TestRoutePattern_ChiGetHead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		fn     keyFunc
		method string
		target string
		want   string
	}{
		{"pattern_get", keyfuncs.RoutePattern(), http.MethodGet, "/users/42", "/users/{id}"},
		{"pattern_head", keyfuncs.RoutePattern(), http.MethodHead, "/users/42", "/users/{id}"},
		{"pattern_head_subrouter", keyfuncs.RoutePattern(), http.MethodHead, "/api/items/7", "/api/items/{id}"},
		{"pattern_head_route", keyfuncs.RoutePattern(), http.MethodHead, "/files/x", "/files/{name}"},
		{"pattern_head_nowhere", keyfuncs.RoutePattern(), http.MethodHead, "/nowhere", routekey.Unmatched},
		{"method_get", routekey.MethodAndPattern, http.MethodGet, "/users/42", "GET /users/{id}"},
		{"method_head", routekey.MethodAndPattern, http.MethodHead, "/users/42", "GET /users/{id}"},
		{"method_head_subrouter", routekey.MethodAndPattern, http.MethodHead, "/api/items/7", "GET /api/items/{id}"},
		{"method_head_route", routekey.MethodAndPattern, http.MethodHead, "/files/x", "HEAD /files/{name}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			top := &recorder{fn: tc.fn}
			with := &recorder{fn: tc.fn}
			r := chi.NewRouter()
			r.Use(chimw.GetHead)
			r.Use(top.mw)
			r.With(with.mw).Get("/users/{id}", ok)
			r.Route("/api", func(r chi.Router) { r.With(with.mw).Get("/items/{id}", ok) })
			r.With(with.mw).Get("/files/{name}", ok)
			r.With(with.mw).Head("/files/{name}", ok)
			serve(r, tc.method, tc.target)
			checkRec(t, top, tc.want, nil)
			if tc.want != routekey.Unmatched {
				checkRec(t, with, tc.want, nil)
			}
		})
	}
}

// TestFuncURLPath: the raw path through Func, the replacement for httprate's
// KeyByEndpoint, keeps a path as r.URL.Path reads it and bounds the rest.
func TestFuncURLPath(t *testing.T) {
	t.Parallel()
	fn := keyfuncs.Func(func(r *http.Request) (string, error) { return r.URL.Path, nil })
	for target, want := range map[string]string{
		"/users/42":     "/users/42",
		"/users/42?x=1": "/users/42", // the query is not part of the key, as with httprate
		"/a%2Fb":        "/a/b",      // the decoded path, as r.URL.Path
		"/" + strings.Repeat("x", keyfuncs.MaxValueLen): "", // hashed: checked below
	} {
		got, err := fn(httptest.NewRequest(http.MethodGet, target, nil))
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		if want == "" {
			if len(got) != keyfuncs.HashedLen || got[0] != '~' {
				t.Errorf("%s: got %q, want a digest", target[:10], got)
			}
			continue
		}
		if got != want {
			t.Errorf("%s: got %q, want %q", target, got, want)
		}
	}
	braces, _ := fn(httptest.NewRequest(http.MethodGet, "/%7Btag%7D", nil))
	if strings.ContainsAny(braces, "{}") {
		t.Errorf("braces kept: %q", braces)
	}
	if _, err := fn(&http.Request{URL: &url.URL{}}); !errors.Is(err, keyreason.ErrEmptyKey) {
		t.Errorf("empty path: %v", err)
	}
}
