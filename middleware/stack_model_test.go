package middleware_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/internal/timerule"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/memory"
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
	runStackModel(t, 300, func(t *testing.T, run int) modelEnv {
		clk := newClock()
		return modelEnv{lims: []ratebudget.Limiter{newMemory(t, clk), newMemory(t, clk)}}
	}, true)
}

// TestStackModelMemoryClock is the model with a clock that moves: between requests the
// limiters' fake clock advances by random amounts, often to exactly a window's end, a
// bucket's next unit or a rolling-window event's leaving, or 1 ms either side, and the
// model follows every time rule's state. Windows are a second or a few, so that the
// headers' whole seconds change. After a refusal the same request is often sent again
// once its Retry-After has passed (admitted unless a limiter the refusal left unasked
// refuses), or 1 ms before (refused when the wait was exactly those seconds).
func TestStackModelMemoryClock(t *testing.T) {
	t.Parallel()
	runStackModel(t, 200, func(t *testing.T, run int) modelEnv {
		clk := newClock()
		return modelEnv{lims: []ratebudget.Limiter{newMemory(t, clk), newMemory(t, clk)}, clk: clk}
	}, true)
}

func TestStackModelRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	runStackModel(t, 100, func(t *testing.T, run int) modelEnv {
		lim, err := lua.New(client, lua.WithPrefix("model"+strconv.Itoa(run)))
		if err != nil {
			t.Fatal(err)
		}
		mem, err := memory.New()
		if err != nil {
			t.Fatal(err)
		}
		return modelEnv{lims: []ratebudget.Limiter{lim, mem}}
	}, false)
}

// modelEnv is one run's limiters, and the fake clock they share when the run moves it
// (nil: nothing moves the clock the model knows of).
type modelEnv struct {
	lims []ratebudget.Limiter
	clk  *fakeClock
}

// runStackModel runs the model runs times. newLimiters gives each run two limiters: half
// of the runs put every layer on the first, the others some layers on the second (layers
// on different limiters decide limiter by limiter). exact is set when nothing moves the
// limiters' clock: every time the headers send is then compared too.
func runStackModel(t *testing.T, runs int, newLimiters func(*testing.T, int) modelEnv, exact bool) {
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

// modelState is every budget's state, kept from the documented time rules at the
// model's clock (now, milliseconds since the run began). Leases are released when the
// handler returns, and requests are sent one at a time, so no lease is ever held when a
// request is decided.
type modelState struct {
	now     int64
	fixed   map[budgetKey]fixedState
	tokens  map[budgetKey]tokenState
	rolling map[budgetKey][]rollEvent
	// anyRefusal is set when a refusal may report any of the refusing rules, not only
	// those of about the longest wait: with X-RateLimit-* the middleware asks no outcome
	// of each rule, and the lua limiter's refusal cache answers a request that names a
	// budget it refused with that refusal. (Runs that are not exact accept any of
	// reportedAny.)
	anyRefusal bool
}

// fixedState is a fixed window: count admitted in the window that closes at end.
type fixedState struct{ count, end int64 }

// tokenState is a token bucket's level at, in scaled units: tokens × window ms, so that
// a refill of Limit tokens per Window is Limit scaled units per millisecond, exactly.
type tokenState struct{ level, at int64 }

// rollEvent is one admission of a rolling window.
type rollEvent struct{ at, cost int64 }

func newModelState() *modelState {
	return &modelState{fixed: map[budgetKey]fixedState{}, tokens: map[budgetKey]tokenState{}, rolling: map[budgetKey][]rollEvent{}}
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// tokenLevel is the level of a token bucket at now: full until first spent, then
// refilled at Limit scaled units per millisecond up to its capacity.
func (s *modelState) tokenLevel(r *ratebudget.Rule, key budgetKey) int64 {
	w := r.Window.Milliseconds()
	full := timerule.Capacity(r) * w
	b, ok := s.tokens[key]
	if !ok {
		return full
	}
	return min(full, b.level+(s.now-b.at)*r.Limit)
}

// rollingEvents are the events of a rolling window still in (now-Window, now].
func (s *modelState) rollingEvents(r *ratebudget.Rule, key budgetKey) []rollEvent {
	var in []rollEvent
	for _, e := range s.rolling[key] {
		if e.at > s.now-r.Window.Milliseconds() {
			in = append(in, e)
		}
	}
	return in
}

// budgetView is a budget as the headers describe it: the units left, the time until it
// is whole again (0: untouched), and the time until more quota is made available (0:
// unknown, or nothing is used), all times in milliseconds.
type budgetView struct{ remaining, reset, avail int64 }

func (s *modelState) view(r *ratebudget.Rule, key budgetKey) budgetView {
	w := r.Window.Milliseconds()
	switch r.Algorithm {
	case ratebudget.FixedWindow:
		if b, ok := s.fixed[key]; ok && s.now < b.end && b.count > 0 {
			return budgetView{r.Limit - b.count, b.end - s.now, b.end - s.now}
		}
		return budgetView{remaining: r.Limit}
	case ratebudget.TokenBucket:
		full := timerule.Capacity(r) * w
		level := s.tokenLevel(r, key)
		v := budgetView{remaining: level / w, reset: ceilDiv(full-level, r.Limit)}
		if level < full {
			// The next whole unit.
			v.avail = ceilDiv((level/w+1)*w-level, r.Limit)
		}
		return v
	case ratebudget.RollingWindow:
		ev := s.rollingEvents(r, key)
		v := budgetView{remaining: r.Limit}
		for _, e := range ev {
			v.remaining -= e.cost
		}
		if len(ev) > 0 {
			v.reset = ev[len(ev)-1].at + w - s.now
		}
		return v
	}
	return budgetView{remaining: r.Limit}
}

// wait is the time from now until cost fits the budget if nothing more is spent, in
// milliseconds: 0 when it fits now.
func (s *modelState) wait(r *ratebudget.Rule, key budgetKey, cost int64) int64 {
	w := r.Window.Milliseconds()
	switch r.Algorithm {
	case ratebudget.FixedWindow:
		if b, ok := s.fixed[key]; ok && s.now < b.end && b.count+cost > r.Limit {
			return b.end - s.now
		}
	case ratebudget.TokenBucket:
		return ceilDiv(cost*w-s.tokenLevel(r, key), r.Limit)
	case ratebudget.RollingWindow:
		ev := s.rollingEvents(r, key)
		sum := int64(0)
		for _, e := range ev {
			sum += e.cost
		}
		need := sum + cost - r.Limit
		for _, e := range ev {
			if need <= 0 {
				break
			}
			need -= e.cost
			if need <= 0 {
				return e.at + w - s.now // the event whose leaving frees enough
			}
		}
	}
	return 0
}

// spend admits cost into the budget at now. It returns a function that puts the budget
// back as it was, as a settle that gives the spend back does.
func (s *modelState) spend(r *ratebudget.Rule, key budgetKey, cost int64) (undo func()) {
	switch r.Algorithm {
	case ratebudget.FixedWindow:
		old, had := s.fixed[key]
		b := old
		if !had || s.now >= b.end || b.count == 0 {
			b = fixedState{end: s.now + r.Window.Milliseconds()} // the first admission opens the window
		}
		b.count += cost
		s.fixed[key] = b
		return func() {
			if had {
				s.fixed[key] = old
			} else {
				delete(s.fixed, key)
			}
		}
	case ratebudget.TokenBucket:
		old, had := s.tokens[key]
		s.tokens[key] = tokenState{level: s.tokenLevel(r, key) - cost*r.Window.Milliseconds(), at: s.now}
		return func() {
			if had {
				s.tokens[key] = old
			} else {
				delete(s.tokens, key)
			}
		}
	case ratebudget.RollingWindow:
		old := s.rolling[key]
		s.rolling[key] = append(s.rollingEvents(r, key), rollEvent{s.now, cost})
		return func() { s.rolling[key] = old }
	}
	return func() {}
}

// deadlines are the times, after now, at which some budget's state changes: a fixed
// window closes, a token bucket gains a unit or is full, a rolling window's event leaves.
func (s *modelState) deadlines(rules map[string]*ratebudget.Rule) []int64 {
	var ds []int64
	for _, b := range s.fixed {
		if b.end > s.now {
			ds = append(ds, b.end)
		}
	}
	for k := range s.tokens {
		r := rules[k.rule]
		v := s.view(r, k)
		if v.avail > 0 {
			ds = append(ds, s.now+v.avail)
		}
		if v.reset > 0 {
			ds = append(ds, s.now+v.reset)
		}
	}
	for k, ev := range s.rolling {
		for _, e := range ev {
			if at := e.at + rules[k.rule].Window.Milliseconds(); at > s.now {
				ds = append(ds, at)
			}
		}
	}
	slices.Sort(ds) // map order would make the runs irreproducible
	return ds
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
	rateLimitT string // rateLimit with the t of each rule
	// rateLimitEarly are the members of rateLimitT, with a token bucket's t that of 1 ms
	// earlier: either is accepted.
	rateLimitEarly []string
	// wait is the model's exact wait of a refusal (ms), refusedGroup the index of the
	// refusing limiter's call (-1 when admitted).
	wait         int64
	refusedGroup int
	// reportedAny lists the rules whose X-RateLimit-Remaining and -Limit ("r/l") a
	// limiter whose clock moves may report (ties of times within a few seconds).
	reportedAny []string
}

func modelRun(t *testing.T, seed uint64, env modelEnv, exact bool, statuses map[int]int) bool {
	t.Helper()
	lims := env.lims
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	two := rng.IntN(2) == 0
	windows := []time.Duration{time.Hour, 2 * time.Hour, 3 * time.Hour, 5 * time.Hour, 7 * time.Hour}
	if env.clk != nil {
		windows = []time.Duration{999 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second, 3 * time.Second, 7 * time.Second}
	}
	// Every layer of a run has one style: runs of even seeds compare X-RateLimit-*, the
	// others the RateLimit field.
	style := headers.IETF
	if seed%2 == 0 {
		style = headers.XRateLimit
	}
	ruleByName := map[string]*ratebudget.Rule{}
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
			ruleByName[r.Name] = &mr.rule
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
		opts := []middleware.Option{middleware.WithHeaders(style), middleware.WithTimeout(time.Minute)}
		if l.cost {
			opts = append(opts, middleware.WithCost(modelCost))
		}
		l.mw = mustNew(t, lims[l.lim], rules, opts...)
		pool = append(pool, l)
	}
	// Layers are mostly distinct on a route; one time in ten a layer may repeat on it
	// (its budgets are then one, decided once, when its identity and scope are the same
	// there).
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

	var ruleList []*ratebudget.Rule
	for _, l := range pool {
		for i := range l.rules {
			ruleList = append(ruleList, &l.rules[i].rule)
		}
	}
	st := newModelState()
	st.anyRefusal = style == headers.XRateLimit
	steps := 40
	if env.clk != nil {
		steps = 80
	}
	// last is the previous request and its response, when that was a refusal.
	var last struct {
		rt   modelRoute
		hdr  map[string]string
		resp *modelResponse
	}
	for range steps {
		var rt modelRoute
		var hdr map[string]string
		adv := int64(0)
		// probe, when not "", says what a request sent again after a refusal must get.
		probe, refusedAgain := "", false
		if env.clk != nil && last.resp != nil && rng.IntN(2) == 0 {
			rt, hdr = last.rt, last.hdr
			ra := int64(last.resp.retryAfter) * 1000
			switch rng.IntN(4) {
			case 0:
				adv, probe = ra, "at Retry-After"
			case 1:
				if last.resp.wait == ra {
					adv, probe, refusedAgain = ra-1, "1ms before Retry-After, the exact wait", true
				} else {
					adv, probe, refusedAgain = last.resp.wait-1, "1ms before the wait", true
				}
			case 2:
				adv, probe = last.resp.wait, "at the wait"
			default:
				adv, probe, refusedAgain = last.resp.wait-1, "1ms before the wait", true
			}
		} else {
			rt = routes[rng.IntN(len(routes))]
			hdr = map[string]string{}
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
			if env.clk != nil {
				adv = st.pickAdvance(rng, ruleByName, ruleList)
			}
		}
		if adv > 0 {
			env.clk.Advance(time.Duration(adv) * time.Millisecond)
			st.now += adv
			trace = append(trace, fmt.Sprintf("+%dms (now %dms)", adv, st.now))
		}
		req := httptest.NewRequest(http.MethodGet, rt.path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		want := st.predict(rt, hdr, exact)
		if style == headers.XRateLimit {
			want.rateLimit, want.rateLimitT, want.rateLimitEarly = "", "", nil
		} else {
			want.reported, want.reportedAny = "", nil
		}
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		got := observed(rec)
		statuses[got.status]++
		trace = append(trace, fmt.Sprintf("GET %s %v -> %+v (model %+v)", rt.path, hdr, got, want))
		if got.status != want.status || (got.retryAfter >= 0) != (want.retryAfter >= 0) ||
			got.rateLimit != want.rateLimit || !reportedMatches(got.reported, want, exact) ||
			exact && (got.retryAfter != want.retryAfter || !rateLimitTMatches(got.rateLimitT, want)) {
			return fail("GET %s %v: got %+v, model %+v; body %q", rt.path, hdr, got, want, rec.Body.String())
		}
		if probe != "" {
			// Waiting never makes a limiter that admitted refuse: after the wait, a refusal
			// can only come from a limiter the first refusal left unasked.
			switch {
			case refusedAgain && (got.status != http.StatusTooManyRequests || want.refusedGroup != last.resp.refusedGroup):
				return fail("sent again %s (%dms): got %+v, want the same refusal as %+v", probe, adv, got, *last.resp)
			case !refusedAgain && got.status == http.StatusTooManyRequests && want.refusedGroup <= last.resp.refusedGroup:
				return fail("sent again %s (%dms): refused again, %+v after %+v", probe, adv, got, *last.resp)
			}
		}
		last.resp = nil
		if got.status == http.StatusTooManyRequests {
			last.rt, last.hdr, last.resp = rt, hdr, &want
		}
	}
	return true
}

// pickAdvance picks how far the clock moves before the next request (ms): not at all,
// a little, a rule's window or 1 ms either side, exactly when some budget's state changes
// or 1 ms either side, or anything up to a few windows.
func (s *modelState) pickAdvance(rng *rand.Rand, rules map[string]*ratebudget.Rule, ruleList []*ratebudget.Rule) int64 {
	switch n := rng.IntN(10); {
	case n < 3:
		return 0
	case n < 4:
		return rng.Int64N(50)
	case n < 6:
		return ruleList[rng.IntN(len(ruleList))].Window.Milliseconds() + rng.Int64N(3) - 1
	case n < 9:
		if ds := s.deadlines(rules); len(ds) > 0 {
			return max(ds[rng.IntN(len(ds))]-s.now+rng.Int64N(3)-1, 0)
		}
	}
	return rng.Int64N(3 * 7000)
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

func rateLimitTMatches(got string, want modelResponse) bool {
	if got == want.rateLimitT {
		return true
	}
	g, w := strings.Split(got, ", "), strings.Split(want.rateLimitT, ", ")
	if len(g) != len(w) || len(w) != len(want.rateLimitEarly) {
		return false
	}
	for i := range g {
		if g[i] != w[i] && g[i] != want.rateLimitEarly[i] {
			return false
		}
	}
	return true
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
	res := modelResponse{status: rec.Code, retryAfter: -1, refusedGroup: -1}
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
		var parts, partsT []string
		for _, m := range strings.Split(v, ", ") {
			fields := strings.Split(m, ";")
			item, itemT := fields[0], fields[0]
			for _, f := range fields[1:] {
				if strings.HasPrefix(f, "r=") {
					item += ";" + f
				}
				if strings.HasPrefix(f, "r=") || strings.HasPrefix(f, "t=") {
					itemT += ";" + f
				}
			}
			parts = append(parts, item)
			partsT = append(partsT, itemT)
		}
		res.rateLimit = strings.Join(parts, ", ")
		res.rateLimitT = strings.Join(partsT, ", ")
	}
	return res
}

// outcome is the model of one check against its budget, before any spend.
type outcome struct {
	fits      bool
	remaining int64 // after the spend when the request is admitted, before otherwise
	// reset, retryAfter and avail (the effective window of RateLimit's t) in ms.
	reset, retryAfter, avail int64
}

func (s *modelState) outcomeOf(c *modelCheck) outcome {
	r := &c.r.rule
	v := s.view(r, c.key)
	wait := s.wait(r, c.key, c.cost)
	return outcome{fits: wait == 0, remaining: v.remaining, reset: v.reset, avail: v.avail, retryAfter: wait}
}

// seconds rounds n milliseconds up to whole seconds, as the headers do.
func seconds(n int64) int64 { return (n + 999) / 1000 }

// predict is the reference model: the response to a request on rt with headers hdr,
// and the state of every budget after it.
func (s *modelState) predict(rt modelRoute, hdr map[string]string, exact bool) modelResponse {
	none := func(status int) modelResponse { return modelResponse{status: status, retryAfter: -1, refusedGroup: -1} }
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
				if r.rule.Algorithm != ratebudget.InFlight && (minCap < 0 || timerule.Capacity(&r.rule) < minCap) {
					minCap = timerule.Capacity(&r.rule)
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
			if k := slices.IndexFunc(checks, func(o modelCheck) bool { return o.key == c.key }); k >= 0 {
				// A layer repeated on the route: one budget, decided once at the first
				// place, at the larger cost.
				checks[k].cost = max(checks[k].cost, c.cost)
				continue
			}
			checks = append(checks, c)
		}
	}
	if len(checks) == 0 {
		return none(rt.status)
	}
	// One all-or-nothing call per limiter, in the order of the layers (the outermost
	// first), each deciding its limiter's checks; a refusal stops the walk, and the
	// limiters before it give their spend back.
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
	res := modelResponse{status: rt.status, retryAfter: -1, refusedGroup: -1}
	if refused < 0 {
		for i := range checks {
			c := &checks[i]
			if c.r.rule.Algorithm == ratebudget.InFlight {
				outs[i].remaining--
				outs[i].reset = c.r.rule.Window.Milliseconds()
				continue
			}
			undo := s.spend(&c.r.rule, c.key, c.cost)
			outs[i] = s.outcomeOf(&modelCheck{r: c.r, key: c.key, cost: 0})
			if c.r.successes && rt.status >= 500 {
				undo() // settled once the headers are sent
			}
		}
		// Each limiter reports its most restrictive rule (the smallest share of its
		// capacity left, then the longest reset, then the first); of those, the first
		// limiter's most restrictive. The model's limits are small: the products fit.
		tighter := func(i, j int) bool {
			a := max(outs[i].remaining, 0) * timerule.Capacity(&checks[j].r.rule)
			b := max(outs[j].remaining, 0) * timerule.Capacity(&checks[i].r.rule)
			return a < b || a == b && outs[i].reset > outs[j].reset
		}
		for _, idx := range groups {
			gb := -1
			for _, i := range idx {
				if gb < 0 || tighter(i, gb) {
					gb = i
				}
			}
			if best < 0 || tighter(gb, best) {
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
		res.retryAfter = int(max(seconds(outs[best].retryAfter), 1))
		res.wait = outs[best].retryAfter
		res.refusedGroup = refused
	}
	const near = 10_000 // ms
	for i := range outs {
		b := &outs[best]
		if refused < 0 && outs[i].remaining == b.remaining && b.reset-outs[i].reset < near ||
			refused >= 0 && listed[i] && !outs[i].fits && (s.anyRefusal || b.retryAfter-outs[i].retryAfter < near) {
			res.reportedAny = append(res.reportedAny, fmt.Sprintf("%d/%d", max(outs[i].remaining, 0), timerule.Capacity(&checks[i].r.rule)))
		}
	}
	res.reported = fmt.Sprintf("%d/%d/%d", max(outs[best].remaining, 0), timerule.Capacity(&checks[best].r.rule), seconds(outs[best].reset))
	var parts, partsT []string
	for i := range checks {
		if listed[i] { // the rules of limiters a refusal left unasked are not known
			p := fmt.Sprintf("%q;r=%d", checks[i].r.rule.Name, max(outs[i].remaining, 0))
			parts = append(parts, p)
			if outs[i].avail > 0 && outs[i].remaining < timerule.Capacity(&checks[i].r.rule) {
				p += fmt.Sprintf(";t=%d", outs[i].avail/1000) // draft-11: rounded down
			}
			partsT = append(partsT, p)
			// A token bucket's t may be that of 1 ms sooner (the headers document it).
			early := p
			if a := outs[i].avail; a > 0 && outs[i].remaining < timerule.Capacity(&checks[i].r.rule) && checks[i].r.rule.Algorithm == ratebudget.TokenBucket {
				early = strings.TrimSuffix(p, fmt.Sprintf(";t=%d", a/1000)) + fmt.Sprintf(";t=%d", (a-1)/1000)
			}
			res.rateLimitEarly = append(res.rateLimitEarly, early)
		}
	}
	res.rateLimit = strings.Join(parts, ", ")
	res.rateLimitT = strings.Join(partsT, ", ")
	return res
}
