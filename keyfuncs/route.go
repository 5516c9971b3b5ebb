package keyfuncs

import (
	"net/http"

	"github.com/ratebudget/ratebudget/internal/keyreason"
	"github.com/ratebudget/ratebudget/internal/routekey"
)

// RoutePattern returns a key function whose key is the pattern of the route the request
// matches, for use as a scope: "/users/{id}", never the raw path "/users/42" (which would
// give every URL its own budget). Route patterns come from the application's
// configuration, not from the request, so the key may contain the pattern's braces.
//
// With chi the pattern is chi's RouteContext(ctx).RoutePattern(); otherwise it is the
// net/http ServeMux pattern in r.Pattern, without its method ("GET /items/{id}" gives
// "/items/{id}", "example.com/items/{id}" stays as it is).
//
// chi resolves the pattern while routing, so what a middleware sees depends on where it
// is installed:
//
//   - r.Use on the top-level router runs before any routing: the pattern is looked up in
//     the router ahead of routing (chi's Find), so the key is the full pattern of the
//     route chi will run ("/api/users/{id}"). A request that no route matches (chi
//     answers 404 or 405) gets the key "~unmatched", one scope for all of them.
//   - r.With(mw).Get(...) and r.Group(func(r chi.Router) { r.Use(mw); ... }) run after the
//     route is found: the key is the full pattern ("/api/users/{id}").
//   - r.Use inside r.Route("/api", ...) or on a router given to r.Mount("/api", ...) runs
//     after the parent router matched the mount point but before the subrouter routes:
//     the key is the mount pattern "/api/*", one scope for the whole subtree.
//
// Without chi, when no pattern is known the result is an error (the middleware answers
// 500 and logs how to mount it): there is no catch-all constant, which would put every
// URL in one scope without anyone noticing. With a ServeMux, a middleware wrapping the
// handler given to mux.Handle sees the pattern; one wrapping the ServeMux itself does
// not, also when that mux is the handler of an enclosing ServeMux (the middleware does
// not take the enclosing mux's pattern for the route's).
//
// For a scope per method of a route, join a method with it. Map HEAD to GET (a HEAD
// request runs the GET route, and its own scope would give a client a second budget by
// alternating HEAD and GET) and methods you do not serve to one value (clients could mint
// new scopes by inventing methods):
//
//	method := keyfuncs.Func(func(r *http.Request) (string, error) {
//		switch r.Method {
//		case http.MethodHead:
//			return http.MethodGet, nil
//		case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
//			return r.Method, nil
//		}
//		return "OTHER", nil
//	})
//	scope := keyfuncs.Join(method, keyfuncs.RoutePattern()) // "3:GET15:/users/%7Bid%7D"
func RoutePattern() func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		p := routekey.Pattern(r)
		if p == "" {
			return "", keyreason.ErrNoRoutePattern
		}
		return p, nil
	}
}
