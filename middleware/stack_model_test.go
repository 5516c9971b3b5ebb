package middleware_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/middleware"
)

// The stacking model test builds random stacks of layers on a chi router (a top-level
// r.Use, r.Group with r.Use, r.With, a subrouter's r.Use, plain wrapping), with random
// rules of every time rule, key functions and costs, sends random requests one at a
// time, and compares every response with a reference model of the promise: one
// all-or-nothing decision per request over every layer's rules, a refusal, 400, 413 or
// 500 spending nothing anywhere, the metadata of the most restrictive rule. Nothing
// refills during a run: the in-process limiter's clock stands still, and on Redis every
// window is an hour or more.
//
// The runs are seeded and reproducible: RATEBUDGET_MODEL_SEED picks another base seed,
// RATEBUDGET_MODEL_RUNS another number of runs.

func TestStackModelMemory(t *testing.T) {
	t.Parallel()
	runStackModel(t, 300, func(t *testing.T, run int) []ratebudget.Limiter {
		clk := newClock()
		return []ratebudget.Limiter{memory(t, clk), memory(t, clk)}
	}, true)
}

func TestStackModelRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	runStackModel(t, 100, func(t *testing.T, run int) []ratebudget.Limiter {
		lim, err := lua.New(client, lua.WithPrefix("model"+strconv.Itoa(run)))
		if err != nil {
			t.Fatal(err)
		}
		mem, err := ratebudget.NewMemory()
		if err != nil {
			t.Fatal(err)
		}
		return []ratebudget.Limiter{lim, mem}
	}, false)
}

// runStackModel runs the model runs times. newLimiters gives each run two limiters: half
// of the runs put every layer on the first, the others some layers on the second (layers
// on different limiters decide limiter by limiter). exact is set when nothing moves the
// limiters' clock: every time the headers send is then compared too.
func runStackModel(t *testing.T, runs int, newLimiters func(*testing.T, int) []ratebudget.Limiter, exact bool) {
	base := uint64(20261201)
	if s := os.Getenv("RATEBUDGET_MODEL_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("RATEBUDGET_MODEL_SEED: %v", err)
		}
		base = v
	}
	if s := os.Getenv("RATEBUDGET_MODEL_RUNS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("RATEBUDGET_MODEL_RUNS: %v", err)
		}
		runs = v
	}
	t.Logf("base seed %d (RATEBUDGET_MODEL_SEED), %d runs", base, runs)
	statuses := map[int]int{}
	defer func() { t.Logf("responses by status: %v", statuses) }()
	for run := range runs {
		seed := base + uint64(run)
		if !modelRun(t, seed, newLimiters(t, run), exact, statuses) {
			t.Fatalf("run %d diverged: RATEBUDGET_MODEL_SEED=%d RATEBUDGET_MODEL_RUNS=1 reproduces it", run, seed)
		}
	}
}

// The model's key functions.
const (
	idGlobal = iota
	idUser   // keyfuncs.Header("X-User")
	idTeam   // keyfuncs.Header("X-Team")
)

type modelRule struct {
	rule      ratebudget.Rule
	id        int
	scoped    bool // keyfuncs.RoutePattern()
	successes bool // CountSuccesses(nil): a 5xx is given back when the handler returns
}

type modelLayer struct {
	name  string
	rules []modelRule
	cost  bool // WithCost from X-Cost
	lim   int  // the index of its limiter
	mw    func(http.Handler) http.Handler
}

func (l *modelLayer) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s{lim=%d cost=%v", l.name, l.lim, l.cost)
	for _, r := range l.rules {
		fmt.Fprintf(&b, " %s:%v/%d/b%d/%v/id%d/scoped=%v/successes=%v", r.rule.Name, r.rule.Algorithm, r.rule.Limit, r.rule.Burst, r.rule.Window, r.id, r.scoped, r.successes)
	}
	return b.String() + "}"
}

// position is a layer where it is mounted on a route, with the route pattern its route
// scope sees there.
type position struct {
	l       *modelLayer
	pattern string
}

type modelRoute struct {
	path   string // a request path of the route
	stack  []position
	status int // the handler's
}

type budgetKey struct {
	lim                   int
	rule, identity, scope string
}

type modelState struct {
	used map[budgetKey]int64 // units spent (leases are released when the handler returns)
}

type modelCheck struct {
	r    *modelRule
	key  budgetKey
	cost int64
}

type modelResponse struct {
	status     int
	retryAfter int    // -1: absent
	reported   string // X-RateLimit-Remaining, -Limit and -Reset: "r/l/reset", "" when absent
	rateLimit  string // the rules and remaining of RateLimit, "" when absent
	// reportedAny lists the rules whose X-RateLimit-Remaining and -Limit ("r/l") a
	// limiter whose clock moves may report (ties of times within a few seconds).
	reportedAny []string
}

func modelRun(t *testing.T, seed uint64, lims []ratebudget.Limiter, exact bool, statuses map[int]int) bool {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	two := rng.IntN(2) == 0
	windows := []time.Duration{time.Hour, 2 * time.Hour, 3 * time.Hour, 5 * time.Hour, 7 * time.Hour}
	var pool []*modelLayer
	for i := range 2 + rng.IntN(3) {
		l := &modelLayer{name: "L" + strconv.Itoa(i), cost: rng.IntN(2) == 0}
		if two && rng.IntN(2) == 0 {
			l.lim = 1
		}
		var rules []middleware.Rule
		for j := range 1 + rng.IntN(2) {
			r := ratebudget.Rule{
				Name:      fmt.Sprintf("L%dr%d", i, j),
				Algorithm: ratebudget.Algorithm(rng.IntN(4)),
				Limit:     1 + rng.Int64N(5),
				Window:    windows[rng.IntN(len(windows))],
			}
			if r.Algorithm == ratebudget.TokenBucket && rng.IntN(2) == 0 {
				r.Burst = 1 + rng.Int64N(5)
			}
			mr := modelRule{rule: r, id: rng.IntN(3), scoped: rng.IntN(2) == 0}
			l.rules = append(l.rules, mr)
			rule := middleware.Rule{Rule: r}
			switch mr.id {
			case idGlobal:
				rule.Identity = keyfuncs.Global()
			case idUser:
				rule.Identity = keyfuncs.Header("X-User")
			case idTeam:
				rule.Identity = keyfuncs.Header("X-Team")
			}
			if mr.scoped {
				rule.Scope = keyfuncs.RoutePattern()
			}
			if r.Algorithm != ratebudget.InFlight && rng.IntN(3) == 0 {
				mr.successes = true
				rule.Counts = middleware.CountSuccesses(nil)
			}
			l.rules[len(l.rules)-1] = mr
			rules = append(rules, rule)
		}
		opts := []middleware.Option{middleware.WithHeaders(headers.Both), middleware.WithTimeout(time.Minute)}
		if l.cost {
			opts = append(opts, middleware.WithCost(modelCost))
		}
		l.mw = mustNew(t, lims[l.lim], rules, opts...)
		pool = append(pool, l)
	}
	// Layers are mostly distinct on a route; one time in ten a layer may repeat on it
	// (one budget named twice is a 500 when its identity and scope are the same there).
	repeats := rng.IntN(10) == 0
	pick := func(max int, outer ...[]*modelLayer) []*modelLayer {
		used := map[*modelLayer]bool{}
		for _, ls := range outer {
			for _, l := range ls {
				used[l] = true
			}
		}
		var ls []*modelLayer
		for range rng.IntN(max + 1) {
			l := pool[rng.IntN(len(pool))]
			if used[l] && !repeats {
				continue
			}
			used[l] = true
			ls = append(ls, l)
		}
		return ls
	}
	mws := func(ls []*modelLayer) []func(http.Handler) http.Handler {
		var out []func(http.Handler) http.Handler
		for _, l := range ls {
			out = append(out, l.mw)
		}
		return out
	}
	at := func(pattern string, lss ...[]*modelLayer) []position {
		var ps []position
		for _, ls := range lss {
			for _, l := range ls {
				ps = append(ps, position{l, pattern})
			}
		}
		return ps
	}
	top := pick(1)
	aw, gu, su, pw := pick(2, top), pick(1, top), pick(1, top), pick(3, top)
	bw, xw, ew := pick(2, top, gu), pick(2, top, su), pick(2, top)

	r := chi.NewRouter()
	r.Use(mws(top)...)
	r.With(mws(aw)...).Get("/a/{id}", ok)
	r.With(mws(ew)...).Get("/e", failing)
	r.Group(func(r chi.Router) {
		r.Use(mws(gu)...)
		r.With(mws(bw)...).Get("/b", ok)
		r.Get("/c/{id}", ok)
	})
	r.Route("/s", func(r chi.Router) {
		r.Use(mws(su)...)
		r.With(mws(xw)...).Get("/x/{id}", ok)
		r.Get("/y", ok)
	})
	var plain http.Handler = ok
	for i := len(pw) - 1; i >= 0; i-- {
		plain = pw[i].mw(plain)
	}
	r.Handle("/p", plain)

	sub := func(pattern string, ls []*modelLayer) []position {
		ps := at(pattern, top)
		for _, l := range ls {
			ps = append(ps, position{l, "/s/*"})
		}
		return ps
	}
	routes := []modelRoute{
		{path: "/a/1", stack: at("/a/{id}", top, aw), status: 200},
		{path: "/a/2", stack: at("/a/{id}", top, aw), status: 200},
		{path: "/b", stack: at("/b", top, gu, bw), status: 200},
		{path: "/c/7", stack: at("/c/{id}", top, gu), status: 200},
		{path: "/s/x/1", stack: append(sub("/s/x/{id}", su), at("/s/x/{id}", xw)...), status: 200},
		{path: "/s/y", stack: sub("/s/y", su), status: 200},
		{path: "/p", stack: at("/p", top, pw), status: 200},
		{path: "/nope", stack: at("~unmatched", top), status: 404},
		{path: "/e", stack: at("/e", top, ew), status: 500},
	}

	var trace []string
	fail := func(format string, args ...any) bool {
		t.Errorf("seed %d: stacks:", seed)
		for _, rt := range routes {
			var names []string
			for _, p := range rt.stack {
				names = append(names, p.l.name+"@"+p.pattern)
			}
			t.Errorf("  %s: %v", rt.path, names)
		}
		for _, l := range pool {
			t.Errorf("  %v", l)
		}
		for _, s := range trace {
			t.Errorf("  %s", s)
		}
		t.Errorf(format, args...)
		return false
	}

	st := &modelState{used: map[budgetKey]int64{}}
	for range 40 {
		rt := routes[rng.IntN(len(routes))]
		req := httptest.NewRequest(http.MethodGet, rt.path, nil)
		hdr := map[string]string{}
		if v := pickValue(rng, "u1", "u2"); v != "-" {
			hdr["X-User"] = v
		}
		if v := pickValue(rng, "t1", "t2"); v != "-" {
			hdr["X-Team"] = v
		}
		switch n := rng.IntN(20); {
		case n < 8:
		case n == 8:
			hdr["X-Cost"] = "0"
		case n == 9:
			hdr["X-Cost"] = "x"
		default:
			hdr["X-Cost"] = strconv.Itoa(1 + rng.IntN(6))
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		want := st.predict(rt, hdr, exact)
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		got := observed(rec)
		statuses[got.status]++
		trace = append(trace, fmt.Sprintf("GET %s %v -> %+v (model %+v)", rt.path, hdr, got, want))
		if got.status != want.status || (got.retryAfter >= 0) != (want.retryAfter >= 0) ||
			got.rateLimit != want.rateLimit || !reportedMatches(got.reported, want, exact) ||
			exact && got.retryAfter != want.retryAfter {
			return fail("GET %s %v: got %+v, model %+v; body %q", rt.path, hdr, got, want, rec.Body.String())
		}
	}
	return true
}

// failing answers 500, which CountSuccesses(nil) does not charge.
var failing = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusInternalServerError)
})

// pickValue returns one of vals, or "-" (the header is not sent) one time in ten.
func pickValue(rng *rand.Rand, vals ...string) string {
	if rng.IntN(10) == 0 {
		return "-"
	}
	return vals[rng.IntN(len(vals))]
}

// modelCost is every cost layer's cost: X-Cost, 1 when absent.
func modelCost(r *http.Request) (int64, error) {
	v := r.Header.Get("X-Cost")
	if v == "" {
		return 1, nil
	}
	return strconv.ParseInt(v, 10, 64)
}

func reportedMatches(got string, want modelResponse, exact bool) bool {
	if exact || got == "" || want.reported == "" {
		return got == want.reported
	}
	got = got[:strings.LastIndexByte(got, '/')] // the reset moves with the clock
	for _, v := range want.reportedAny {
		if got == v {
			return true
		}
	}
	return false
}

func observed(rec *httptest.ResponseRecorder) modelResponse {
	res := modelResponse{status: rec.Code, retryAfter: -1}
	if h := rec.Header(); h.Get("X-RateLimit-Remaining") != "" {
		res.reported = h.Get("X-RateLimit-Remaining") + "/" + h.Get("X-RateLimit-Limit") + "/" + h.Get("X-RateLimit-Reset")
	}
	if v := rec.Header().Get("Retry-After"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			n = -2
		}
		res.retryAfter = n
	}
	if v := rec.Header().Get("RateLimit"); v != "" {
		var parts []string
		for _, m := range strings.Split(v, ", ") {
			fields := strings.Split(m, ";")
			item := fields[0]
			for _, f := range fields[1:] {
				if strings.HasPrefix(f, "r=") {
					item += ";" + f
				}
			}
			parts = append(parts, item)
		}
		res.rateLimit = strings.Join(parts, ", ")
	}
	return res
}

// outcome is the model of one check against its budget, before any spend.
type outcome struct {
	fits              bool
	remaining         int64 // after the spend when the request is admitted, before otherwise
	reset, retryAfter time.Duration
}

func (s *modelState) outcomeOf(c *modelCheck) outcome {
	r := &c.r.rule
	used := s.used[c.key]
	capacity := r.Capacity()
	o := outcome{fits: used+c.cost <= capacity, remaining: capacity - used}
	per := r.Window / time.Duration(r.Limit)
	switch r.Algorithm {
	case ratebudget.FixedWindow, ratebudget.RollingWindow:
		if used > 0 {
			o.reset = r.Window
		}
		if !o.fits {
			o.retryAfter = r.Window
		}
	case ratebudget.TokenBucket:
		o.reset = time.Duration(used) * per
		if !o.fits {
			o.retryAfter = time.Duration(used+c.cost-capacity) * per
		}
	case ratebudget.InFlight:
		// Requests run one at a time: no lease is held when one is decided.
	}
	return o
}

// seconds rounds d up to whole seconds, as the headers do.
func seconds(d time.Duration) int { return int((d + time.Second - 1) / time.Second) }

// predict is the reference model: the response to a request on rt with headers hdr,
// and the state of every budget after it.
func (s *modelState) predict(rt modelRoute, hdr map[string]string, exact bool) modelResponse {
	none := func(status int) modelResponse { return modelResponse{status: status, retryAfter: -1} }
	var checks []modelCheck
	for _, p := range rt.stack {
		cost := int64(1)
		if p.l.cost {
			if v, ok := hdr["X-Cost"]; ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil || n < 1 {
					return none(http.StatusBadRequest)
				}
				cost = n
			}
			minCap := int64(-1)
			for _, r := range p.l.rules {
				if r.rule.Algorithm != ratebudget.InFlight && (minCap < 0 || r.rule.Capacity() < minCap) {
					minCap = r.rule.Capacity()
				}
			}
			if minCap >= 0 && cost > minCap {
				return none(http.StatusRequestEntityTooLarge)
			}
		}
		for i := range p.l.rules {
			r := &p.l.rules[i]
			c := modelCheck{r: r, cost: cost, key: budgetKey{lim: p.l.lim, rule: r.rule.Name}}
			switch r.id {
			case idGlobal:
				c.key.identity = "global"
			case idUser:
				c.key.identity = hdr["X-User"]
			case idTeam:
				c.key.identity = hdr["X-Team"]
			}
			if c.key.identity == "" {
				return none(http.StatusBadRequest)
			}
			if r.scoped {
				c.key.scope = p.pattern
			}
			if r.rule.Algorithm == ratebudget.InFlight {
				c.cost = 1
			}
			checks = append(checks, c)
		}
	}
	if len(checks) == 0 {
		return none(rt.status)
	}
	// One all-or-nothing call per limiter, in the order of the layers (the outermost
	// first), each deciding its limiter's checks; a refusal or a configuration error
	// stops the walk, and the limiters before it give their spend back.
	var groups [][]int
	for i := range checks {
		k := -1
		for g := range groups {
			if checks[groups[g][0]].key.lim == checks[i].key.lim {
				k = g
			}
		}
		if k < 0 {
			k = len(groups)
			groups = append(groups, nil)
		}
		groups[k] = append(groups[k], i)
	}
	outs := make([]outcome, len(checks))
	listed := make([]bool, len(checks))
	refused, best := -1, -1
	for g, idx := range groups {
		for a, i := range idx {
			for _, j := range idx[:a] {
				if checks[i].key == checks[j].key {
					return none(http.StatusInternalServerError) // one budget named twice
				}
			}
		}
		for _, i := range idx {
			outs[i] = s.outcomeOf(&checks[i])
			listed[i] = true
			if !outs[i].fits {
				refused = g
			}
		}
		if refused >= 0 {
			break
		}
	}
	res := modelResponse{status: rt.status, retryAfter: -1}
	if refused < 0 {
		for i := range checks {
			c := &checks[i]
			if c.r.rule.Algorithm == ratebudget.InFlight {
				outs[i].remaining--
				outs[i].reset = c.r.rule.Window
				continue
			}
			s.used[c.key] += c.cost
			outs[i] = s.outcomeOf(&modelCheck{r: c.r, key: c.key, cost: 0})
			if c.r.successes && rt.status >= 500 {
				s.used[c.key] -= c.cost // settled once the headers are sent
			}
		}
		// Each limiter reports its most restrictive rule (fewest remaining, then the
		// longest reset, then the first); of those, the first limiter's most restrictive.
		for _, idx := range groups {
			gb := -1
			for _, i := range idx {
				if gb < 0 || outs[i].remaining < outs[gb].remaining ||
					outs[i].remaining == outs[gb].remaining && outs[i].reset > outs[gb].reset {
					gb = i
				}
			}
			if best < 0 || outs[gb].remaining < outs[best].remaining ||
				outs[gb].remaining == outs[best].remaining && outs[gb].reset > outs[best].reset {
				best = gb
			}
		}
	} else {
		res.status = http.StatusTooManyRequests
		for _, i := range groups[refused] {
			if !outs[i].fits && (best < 0 || outs[i].retryAfter > outs[best].retryAfter) {
				best = i
			}
		}
		res.retryAfter = seconds(outs[best].retryAfter)
	}
	const near = 10 * time.Second
	for i := range outs {
		b := &outs[best]
		if refused < 0 && outs[i].remaining == b.remaining && b.reset-outs[i].reset < near ||
			refused >= 0 && listed[i] && !outs[i].fits && b.retryAfter-outs[i].retryAfter < near {
			res.reportedAny = append(res.reportedAny, fmt.Sprintf("%d/%d", max(outs[i].remaining, 0), checks[i].r.rule.Capacity()))
		}
	}
	res.reported = fmt.Sprintf("%d/%d/%d", max(outs[best].remaining, 0), checks[best].r.rule.Capacity(), seconds(outs[best].reset))
	var parts []string
	for i := range checks {
		if listed[i] { // the rules of limiters a refusal left unasked are not known
			parts = append(parts, fmt.Sprintf("%q;r=%d", checks[i].r.rule.Name, max(outs[i].remaining, 0)))
		}
	}
	res.rateLimit = strings.Join(parts, ", ")
	return res
}
