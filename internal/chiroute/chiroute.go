// Package chiroute looks ahead in a chi router: which pattern a request will match, and
// what chi will run first once it has routed the request. The middleware uses it to
// learn, before chi routes, whether the next thing to run is another rate-limit layer.
package chiroute

import (
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"

	"github.com/go-chi/chi/v5"
)

// Probe recognises the routing step of chi muxes: the handler that a Mux's r.Use
// middlewares wrap. It is the same function for every Mux, so its code pointer, learned
// once from a throwaway Mux, identifies it.
type Probe struct{ pc uintptr }

// NewProbe builds a throwaway Mux to learn the routing step's code pointer.
func NewProbe() Probe {
	var seen http.Handler
	mx := chi.NewRouter()
	mx.Use(func(next http.Handler) http.Handler { seen = next; return next })
	mx.Get("/", func(http.ResponseWriter, *http.Request) {})
	mx.ServeHTTP(nopWriter{}, &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/"}, Header: http.Header{}})
	var p Probe
	if hf, ok := seen.(http.HandlerFunc); ok {
		p.pc = reflect.ValueOf(hf).Pointer()
	}
	return p
}

// IsRouting reports whether h is a chi Mux's routing step.
func (p Probe) IsRouting(h http.Handler) bool {
	hf, ok := h.(http.HandlerFunc)
	return ok && p.pc != 0 && reflect.ValueOf(hf).Pointer() == p.pc
}

// FuncPC returns f's code pointer, which all method values of one method share.
func FuncPC(f any) uintptr {
	v := reflect.ValueOf(f)
	if v.Kind() != reflect.Func || v.IsNil() {
		return 0
	}
	return v.Pointer()
}

// Cache remembers what [Level] and [First] learned from a router's route list, which chi
// rebuilds on every call. Its keys are route patterns and muxes, which come from the
// configuration; it stops remembering past maxEntries. It is safe for concurrent use.
type Cache struct {
	mu    sync.RWMutex
	subs  map[subKey]chi.Routes
	first map[firstKey]firstVal
}

const maxEntries = 4096

type subKey struct {
	mux     chi.Routes
	pattern string
}

type firstKey struct {
	mux             chi.Routes
	method, pattern string
}

type firstVal struct {
	mw func(http.Handler) http.Handler
	h  http.Handler
	ok bool
}

// Level returns the Mux that routes r next (the one whose routing step is about to run)
// and the method and path it routes, or nil when r is not inside a chi router or is
// routed already.
func (c *Cache) Level(r *http.Request) (mux chi.Routes, method, path string) {
	rctx := chi.RouteContext(r.Context())
	if rctx == nil || rctx.Routes == nil {
		return nil, "", ""
	}
	method = rctx.RouteMethod
	if method == "" {
		method = r.Method
	}
	mux = rctx.Routes
	for _, p := range rctx.RoutePatterns {
		if !strings.HasSuffix(p, "/*") {
			return nil, "", "" // already routed to an endpoint
		}
		sub := c.subrouter(mux, p)
		if sub == nil {
			return nil, "", ""
		}
		mux = sub
	}
	path = rctx.RoutePath
	if path == "" {
		if r.URL.RawPath != "" {
			path = r.URL.RawPath
		} else {
			path = r.URL.Path
		}
		if path == "" {
			path = "/"
		}
	}
	return mux, method, path
}

func (c *Cache) subrouter(mux chi.Routes, pattern string) chi.Routes {
	if _, ok := mux.(*chi.Mux); !ok {
		return findSub(mux, pattern) // only chi's own Mux is known to be comparable
	}
	k := subKey{mux, pattern}
	c.mu.RLock()
	sub, ok := c.subs[k]
	c.mu.RUnlock()
	if ok {
		return sub
	}
	sub = findSub(mux, pattern)
	c.mu.Lock()
	if c.subs == nil {
		c.subs = make(map[subKey]chi.Routes)
	}
	if len(c.subs) < maxEntries {
		c.subs[k] = sub
	}
	c.mu.Unlock()
	return sub
}

func findSub(mux chi.Routes, pattern string) chi.Routes {
	for _, rt := range mux.Routes() {
		if rt.Pattern == pattern && rt.SubRoutes != nil {
			return rt.SubRoutes
		}
	}
	return nil
}

// First is the cached [First]; levels are Find's for pattern.
func (c *Cache) First(mux chi.Routes, method, pattern string, levels []string) (mw func(http.Handler) http.Handler, h http.Handler, ok bool) {
	if _, ok := mux.(*chi.Mux); !ok {
		return First(mux, method, levels)
	}
	// chi's tree resolves one method and pattern always through the same routers, so
	// the pattern stands for its levels.
	if pattern == "" {
		// A subrouter answers 404 or 405: its mount patterns (each ending in "/*")
		// stand for it.
		pattern = "404 " + strings.Join(levels, "")
	}
	k := firstKey{mux, method, pattern}
	c.mu.RLock()
	v, hit := c.first[k]
	c.mu.RUnlock()
	if hit {
		return v.mw, v.h, v.ok
	}
	v.mw, v.h, v.ok = First(mux, method, levels)
	c.mu.Lock()
	if c.first == nil {
		c.first = make(map[firstKey]firstVal)
	}
	if len(c.first) < maxEntries {
		c.first[k] = v
	}
	c.mu.Unlock()
	return v.mw, v.h, v.ok
}

// Find returns the pattern below mux that method and path match ("" for none), and the
// pattern each router on the way matched: the mount patterns ("/api/*", or a mount's
// own path "/api"), then the route's.
func Find(mux chi.Routes, method, path string) (pattern string, levels []string) {
	rctx := chi.NewRouteContext()
	pattern = mux.Find(rctx, method, path)
	return pattern, rctx.RoutePatterns
}

// First returns what mux runs first for a request whose routers matched levels (Find's)
// with method: the first middleware of the route's chain, or when it has none the
// route's handler. It descends through subrouters without middlewares. ok is false when
// nothing is found.
//
// Routes are matched by their patterns, level by level, never by a prefix of the
// request's full pattern: a route "/apikeys" is not inside a subrouter mounted at "/api".
func First(mux chi.Routes, method string, levels []string) (mw func(http.Handler) http.Handler, h http.Handler, ok bool) {
	for depth := 0; depth < 16 && mux != nil && len(levels) > 0; depth++ {
		pattern := levels[0]
		levels = levels[1:]
		var sub *chi.Route
		for _, rt := range mux.Routes() {
			if rt.SubRoutes == nil {
				if rt.Pattern != pattern {
					continue
				}
				eh := rt.Handlers[method]
				if eh == nil {
					eh = rt.Handlers["*"]
				}
				if eh != nil {
					return firstOf(eh)
				}
				continue // the method runs the mount sharing this path, if any
			}
			switch rt.Pattern {
			case pattern:
			case pattern + "*", pattern + "/*":
				// The mount's own path ("/api", "/api/"): chi runs the subrouter on
				// "/", which Find does not descend into.
				if len(levels) == 0 {
					_, levels = Find(rt.SubRoutes, method, "/")
				}
			default:
				continue
			}
			rt := rt
			sub = &rt
		}
		if sub == nil {
			return nil, nil, false
		}
		if stub := sub.Handlers["*"]; stub != nil {
			if ch, ok := stub.(*chi.ChainHandler); ok && len(ch.Middlewares) > 0 {
				return ch.Middlewares[0], nil, true // With(...) before Mount
			}
		}
		if mws := sub.SubRoutes.Middlewares(); len(mws) > 0 {
			return mws[0], nil, true
		}
		mux = sub.SubRoutes
	}
	return nil, nil, false
}

func firstOf(h http.Handler) (func(http.Handler) http.Handler, http.Handler, bool) {
	if ch, ok := h.(*chi.ChainHandler); ok {
		if len(ch.Middlewares) > 0 {
			return ch.Middlewares[0], nil, true
		}
		return nil, ch.Endpoint, true
	}
	return nil, h, true
}

type nopWriter struct{}

func (nopWriter) Header() http.Header         { return http.Header{} }
func (nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (nopWriter) WriteHeader(int)             {}
