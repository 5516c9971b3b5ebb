package keyfuncs

import (
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
)

// RoutePattern returns a KeyFunc whose key is the route pattern the request has matched
// so far, for use as a scope: "/users/{id}", never the raw path "/users/42" (which would
// give every URL its own budget). Route patterns come from the application's
// configuration, not from the request, so the key may contain the pattern's braces.
//
// With chi the pattern is chi's RouteContext(ctx).RoutePattern(); otherwise it is the
// net/http ServeMux pattern in r.Pattern, without its method ("GET /items/{id}" gives
// "/items/{id}", "example.com/items/{id}" stays as it is). When neither is known the result is
// [ErrNoRoutePattern]: there is no catch-all constant, which would put every unmatched
// URL in one scope without anyone noticing.
//
// chi resolves the pattern while routing, so what a middleware sees depends on where it
// is installed:
//
//   - r.Use on the top-level router runs before any routing: no pattern is known and
//     every request is refused with [ErrNoRoutePattern]. Install the middleware as below.
//   - r.With(mw).Get(...) and r.Group(func(r chi.Router) { r.Use(mw); ... }) run after the
//     route is found: the key is the full pattern ("/api/users/{id}").
//   - r.Use inside r.Route("/api", ...) or on a router given to r.Mount("/api", ...) runs
//     after the parent router matched the mount point but before the subrouter routes:
//     the key is the mount pattern "/api/*", one scope for the whole subtree.
//
// With a ServeMux, a middleware wrapping the handler given to mux.Handle sees the
// pattern; one wrapping the ServeMux itself does not.
func RoutePattern() KeyFunc {
	return func(r *http.Request) (string, error) {
		p := routePattern(r)
		if p == "" {
			return "", ErrNoRoutePattern
		}
		return p, nil
	}
}

// MethodAndRoutePattern is [RoutePattern] prefixed with the request method and a space:
// "GET /users/{id}", so that each method of a route has its own scope. HEAD is reported
// as GET when the pattern was registered for GET (ServeMux patterns "GET /x" match HEAD
// requests too), and any method outside the RFC 9110 and RFC 5789 set (GET, HEAD, POST,
// PUT, PATCH, DELETE, CONNECT, OPTIONS, TRACE) is reported as "OTHER", so that clients
// cannot mint new scopes by inventing methods.
func MethodAndRoutePattern() KeyFunc {
	return func(r *http.Request) (string, error) {
		p := routePattern(r)
		if p == "" {
			return "", ErrNoRoutePattern
		}
		m := method(r.Method)
		if m == http.MethodHead && strings.HasPrefix(r.Pattern, "GET ") {
			m = http.MethodGet
		}
		return m + " " + p, nil
	}
}

// routePattern returns the pattern matched so far, or "".
func routePattern(r *http.Request) string {
	if rctx := chi.RouteContext(r.Context()); rctx != nil {
		// Under chi, r.Pattern is whatever chi last set (or an enclosing ServeMux's
		// pattern, relative to another root), so only chi's own record is used.
		if len(rctx.RoutePatterns) == 0 {
			return ""
		}
		return rctx.RoutePattern()
	}
	p := r.Pattern
	if p == "" {
		return ""
	}
	// ServeMux pattern: [METHOD ][HOST]/[PATH]; drop the method.
	if i := strings.IndexAny(p, " \t"); i >= 0 {
		p = strings.TrimLeft(p[i:], " \t")
	}
	return p
}

func method(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "OTHER"
}
