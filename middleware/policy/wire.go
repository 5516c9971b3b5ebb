package policy

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/routekey"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/middleware"
)

// skipPlan is the plan of a request a rule does not apply to (its match does not hold,
// or a rule that replaces it matches): Unlimited, so the rule is left out of the
// decision. A plan of the file never has a name starting with a dot.
const skipPlan = ".skip"

// Middleware returns middleware that decides every request under p's rules, in one
// decision in lim (see middleware.New, which opts configure and which validates): each
// rule of the file is a middleware.Rule named as in the file, whose plans are the
// file's plans and overrides (an override is the plan named "PLAN.OVERRIDE"). A rule
// that does not apply to a request, is replaced for it or is unlimited on its plan is
// left out of the decision: no store call, no metadata, nothing spent.
//
// Identities: ip is keyfuncs.ClientIP with the options of the file's client_ip section
// (without it, the connection's address, IPv6 by /64; match.ip reads the same address,
// ungrouped), header:NAME keyfuncs.Header(NAME), hashed_header:NAME keyfuncs.HashedHeader(NAME, nil)
// (SHA-256), global keyfuncs.Global(); scope route is keyfuncs.RoutePattern() and
// method_route the request's method and the route pattern, "GET /users/{id}" (HEAD on a
// GET route is GET, a method outside RFC 9110 and RFC 5789 is OTHER).
//
// Budgets are named by the rules' names: middleware built from a later version of the
// file (see [Watcher.Middleware]) spends from the same budgets, under the new limits.
func (p *Policy) Middleware(lim ratebudget.Limiter, opts ...middleware.Option) (func(http.Handler) http.Handler, error) {
	rules, err := p.middlewareRules()
	if err != nil {
		return nil, err
	}
	return middleware.New(lim, rules, opts...)
}

// middlewareRules are p's rules as the middleware takes them.
func (p *Policy) middlewareRules() ([]middleware.Rule, error) {
	out := make([]middleware.Rule, len(p.rules))
	for i := range p.rules {
		ru := &p.rules[i]
		own := p.classes[0].limits[i]
		mr := middleware.Rule{Rule: ru.timeRule(own), Shadow: own.Shadow, Counts: ru.counting()}
		var err error
		if mr.Identity, err = p.identity(ru.identity); err != nil {
			return nil, err
		}
		mr.Scope = scope(ru.scope)
		varies, conditional := p.varies(i), ru.conditional() || own.Unlimited
		if varies {
			for _, c := range p.classes[1:] {
				mr.Plans = append(mr.Plans, plan(c.name, c.limits[i]))
			}
		}
		if varies || conditional {
			// A rule decided alike for every request it applies to has no plans but
			// the one that leaves it out: the lookup of the tenant is saved, and its
			// metadata names no plan.
			mr.Plans = append(mr.Plans, middleware.Plan{Name: skipPlan, Unlimited: true})
			mr.Plan = p.planOf(i, varies)
		}
		out[i] = mr
	}
	return out, nil
}

// plan is the middleware's plan named name for the values l.
func plan(name string, l limits) middleware.Plan {
	if l.Unlimited {
		return middleware.Plan{Name: name, Unlimited: true}
	}
	return middleware.Plan{Name: name, Limit: l.Limit, Window: l.Window, Burst: l.Burst, Shadow: l.Shadow}
}

// planOf returns the function that gives the plan a request is on for rule i: skipPlan
// when the rule does not apply to it or is unlimited for it, else its tenant's plan, or
// "" (the rule's own values) when the rule does not vary by plan.
func (p *Policy) planOf(i int, varies bool) func(*http.Request) (string, error) {
	own := &p.classes[0]
	return func(r *http.Request) (string, error) {
		if !p.applies(i, r) {
			return skipPlan, nil
		}
		c := own
		if varies {
			c = p.classOf(r)
		}
		if c.limits[i].Unlimited {
			return skipPlan, nil
		}
		return c.name, nil
	}
}

// varies reports whether rule i has other values on some plan or override than its own.
func (p *Policy) varies(i int) bool {
	for _, c := range p.classes[1:] {
		if c.limits[i] != p.classes[0].limits[i] {
			return true
		}
	}
	return false
}

// conditional reports whether the rule applies to some requests only: it has a match,
// or a rule replaces it.
func (ru *rule) conditional() bool {
	m := &ru.match
	return m.method != "" || m.path != "" || m.pathPrefix || len(m.headers) > 0 || len(m.ips) > 0 || len(ru.replacedBy) > 0
}

func (ru *rule) counting() middleware.Counting {
	switch ru.counts.Contract {
	case "successes":
		return middleware.CountSuccesses(nil)
	case "request_bytes":
		return middleware.CountRequestBytes()
	case "response_bytes":
		return middleware.CountResponseBytes(ru.counts.Estimate)
	case "response_header":
		return middleware.CountResponseHeader(ru.counts.Estimate, ru.counts.Header)
	}
	return middleware.Counting{}
}

// identity is the key function of a rule's identity (checked by compile).
func (p *Policy) identity(id string) (func(*http.Request) (string, error), error) {
	kind, name, _ := strings.Cut(id, ":")
	switch kind {
	case "ip":
		return p.clientIP, nil
	case "global":
		return keyfuncs.Global(), nil
	case "header":
		return keyfuncs.Header(name), nil
	case "hashed_header":
		return keyfuncs.HashedHeader(name, nil), nil
	}
	return nil, fmt.Errorf("policy: unknown identity %q", id)
}

func scope(s string) func(*http.Request) (string, error) {
	switch s {
	case "route":
		return keyfuncs.RoutePattern()
	case "method_route":
		return routekey.MethodAndPattern
	}
	return nil
}

// Middleware returns middleware that decides each request under the policy in effect
// when the request arrives, as [Policy.Middleware] would: the policy is read once per
// request, so a request is decided under one version of the file, never a mix. The
// middleware of a new version is built by the first request that sees it; a version
// whose middleware cannot be built (lim cannot settle a rule that needs it) is logged
// once and the version before it goes on deciding. Budgets go on across versions: they
// are named by the rules' names, never by their limits, so a reload that changes only
// limits resets nothing, and a rule that disappears and comes back finds its budget as
// long as the store keeps its keys. Each version has middleware of its own: its circuit
// breaker and local fallback (middleware.WithLocalFallback) start afresh.
//
// The policy's rules make one decision among themselves; a layer of package middleware
// stacked around this one decides apart from it.
func (w *Watcher) Middleware(lim ratebudget.Limiter, opts ...middleware.Option) (func(http.Handler) http.Handler, error) {
	p := w.Policy()
	first, err := p.Middleware(lim, opts...)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		h := &current{w: w, lim: lim, opts: opts, next: next}
		h.v.Store(&version{p: p, h: first(next)})
		return h
	}, nil
}

// version is a policy and the handler that decides under it.
type version struct {
	p *Policy
	h http.Handler
}

// current serves each request through the version of the policy in effect.
type current struct {
	w    *Watcher
	lim  ratebudget.Limiter
	opts []middleware.Option
	next http.Handler
	v    atomic.Pointer[version]
	// failed is the last policy whose middleware could not be built.
	failed atomic.Pointer[Policy]
	mu     sync.Mutex // one build at a time
}

func (h *current) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	p := h.w.Policy()
	v := h.v.Load()
	if v.p != p && h.failed.Load() != p {
		v = h.build(p)
	}
	v.h.ServeHTTP(rw, r)
}

// build makes p's version current, and returns it; or returns the current version when
// p's middleware cannot be built.
func (h *current) build(p *Policy) *version {
	h.mu.Lock()
	defer h.mu.Unlock()
	if v := h.v.Load(); v.p == p || h.failed.Load() == p {
		return v
	}
	mw, err := p.Middleware(h.lim, h.opts...)
	if err != nil {
		h.failed.Store(p)
		slog.Default().Error("ratebudget: the policy file's new version cannot be served; the version before it stays in effect",
			slog.String("file", p.file), slog.Any("err", err))
		return h.v.Load()
	}
	v := &version{p: p, h: mw(h.next)}
	h.v.Store(v)
	return v
}
