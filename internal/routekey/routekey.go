// Package routekey finds the route pattern a request matches, for the route scopes of
// package keyfuncs (RoutePattern) and of policy files (route, method_route). Its
// functions keep no state and are safe for concurrent use.
package routekey

import (
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/ratebudget/ratebudget/internal/keyreason"
)

// Unmatched is the pattern [Pattern] gives a request that no route of a chi router
// matches, when looked up before routing (a top-level r.Use). Route patterns start with
// '/', so no pattern equals it.
const Unmatched = "~unmatched"

// MethodAndPattern is the scope of a policy file's method_route: the route's [Pattern]
// prefixed with the request method and a space, "GET /users/{id}", so that each method of
// a route has its own scope. HEAD is reported as GET when it runs a route registered for
// GET (ServeMux patterns "GET /x" match HEAD requests too, and chi's middleware.GetHead
// routes HEAD to GET routes), and any method outside the RFC 9110 and RFC 5789 set (GET,
// HEAD, POST, PUT, PATCH, DELETE, CONNECT, OPTIONS, TRACE) is reported as "OTHER", so
// that clients cannot mint new scopes by inventing methods. Without a known pattern the
// error is keyreason.ErrNoRoutePattern.
func MethodAndPattern(r *http.Request) (string, error) {
	p := Pattern(r)
	if p == "" {
		return "", keyreason.ErrNoRoutePattern
	}
	m := method(r.Method)
	if m == http.MethodHead && headRoutedAsGet(r) {
		m = http.MethodGet
	}
	return m + " " + p, nil
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

// Pattern returns the pattern of the route r matches so far, or "" when none is known.
// With chi it is chi's RouteContext(ctx).RoutePattern(), or before routing the pattern of
// the route chi will run ([Unmatched] when there is none); otherwise it is the net/http
// ServeMux pattern in r.Pattern, without its method.
func Pattern(r *http.Request) string {
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
	return Unmatched
}
