package keyfuncs

import (
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
)

// RoutePattern returns a KeyFunc whose key is the pattern of the route the request
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
// Without chi, when no pattern is known the result is [ErrNoRoutePattern] (the
// middleware answers 500 and logs how to mount it): there is no catch-all constant,
// which would put every URL in one scope without anyone noticing. With a ServeMux, a
// middleware wrapping the handler given to mux.Handle sees the pattern; one wrapping the
// ServeMux itself does not, also when that mux is the handler of an enclosing ServeMux
// (the middleware does not take the enclosing mux's pattern for the route's).
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
// as GET when it runs a route registered for GET (ServeMux patterns "GET /x" match HEAD
// requests too, and chi's middleware.GetHead routes HEAD to GET routes), and any method
// outside the RFC 9110 and RFC 5789 set (GET, HEAD, POST, PUT, PATCH, DELETE, CONNECT,
// OPTIONS, TRACE) is reported as "OTHER", so that clients cannot mint new scopes by
// inventing methods.
func MethodAndRoutePattern() KeyFunc {
	return func(r *http.Request) (string, error) {
		p := routePattern(r)
		if p == "" {
			return "", ErrNoRoutePattern
		}
		m := method(r.Method)
		if m == http.MethodHead && headRoutedAsGet(r) {
			m = http.MethodGet
		}
		return m + " " + p, nil
	}
}

// headRoutedAsGet reports whether a HEAD request runs a route registered for GET: under
// chi, when chi routes it as GET (chi's middleware.GetHead sets rctx.RouteMethod for a
// HEAD request without a HEAD route); otherwise, when the ServeMux pattern is a GET one.
func headRoutedAsGet(r *http.Request) bool {
	if rctx := chi.RouteContext(r.Context()); rctx != nil {
		return rctx.RouteMethod == http.MethodGet
	}
	return strings.HasPrefix(r.Pattern, "GET ")
}

// unmatchedRoute is the key [RoutePattern] and [MethodAndRoutePattern] give a request
// that no route of a chi router matches, when looked up before routing (a top-level
// r.Use). Route patterns start with '/', so no pattern equals it.
const unmatchedRoute = "~unmatched"

// routePattern returns the pattern matched so far, or "".
func routePattern(r *http.Request) string {
	if rctx := chi.RouteContext(r.Context()); rctx != nil {
		// Under chi, r.Pattern is whatever chi last set (or an enclosing ServeMux's
		// pattern, relative to another root), so only chi's own record is used.
		if len(rctx.RoutePatterns) == 0 {
			return patternAhead(r, rctx)
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

// patternAhead looks up, before the top-level chi router routes r, the pattern of the
// route it will run: chi's own Find, on the path and with the method chi will route by.
func patternAhead(r *http.Request, rctx *chi.Context) string {
	if rctx.Routes == nil {
		return ""
	}
	path := rctx.RoutePath
	if path == "" {
		path = r.URL.RawPath
		if path == "" {
			path = r.URL.Path
		}
		if path == "" {
			path = "/"
		}
	}
	// chi routes by rctx.RouteMethod when a middleware set it (GetHead routes a HEAD
	// request without a HEAD route as GET), by r.Method otherwise.
	method := rctx.RouteMethod
	if method == "" {
		method = r.Method
	}
	if p := rctx.Routes.Find(chi.NewRouteContext(), method, path); p != "" {
		return p
	}
	return unmatchedRoute
}
