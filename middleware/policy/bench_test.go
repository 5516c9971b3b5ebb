package policy

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/israce"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// discard is a ResponseWriter that keeps nothing but its header map, reused across
// requests.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// benchPolicy is three rules that admit every request of a benchmark (a per-IP rule, one
// matched by method and path with plans, a calendar quota matched by a path prefix) and
// n tenants by X-API-Key, alternately on free and pro.
func benchPolicy(n int) string {
	var b strings.Builder
	b.WriteString(`rules:
  - {name: per-ip, identity: ip, time: {limit: 1099511627776, window: 1h}}
  - {name: hello, identity: header:X-API-Key, match: {method: GET, path: /api/hello}, time: {limit: 1099511627776, window: 1h}}
  - {name: daily, identity: header:X-API-Key, match: {path: /api/*}, time: {type: calendar, limit: 1099511627776, period: day, zone: America/New_York}}
plans:
  free: {hello: {limit: 1099511627775}}
  pro: {hello: {limit: 1099511627774}}
tenants:
  header: X-API-Key
  default: free
  keys:
`)
	for i := range n {
		fmt.Fprintf(&b, "    key-%d: %s\n", i, [2]string{"free", "pro"}[i%2])
	}
	return b.String()
}

// benchHandlers returns the middleware of benchPolicy(tenants) and, beside it, the same
// three rules written as middleware.Rules without plans or matches (each applying to
// every request), each on an in-process limiter of its own, and requests of the tenants.
func benchHandlers(tb testing.TB, tenants int) (fromPolicy, fixed http.Handler, reqs []*http.Request) {
	tb.Helper()
	p, err := Parse("bench.yaml", []byte(benchPolicy(tenants)))
	if err != nil {
		tb.Fatal(err)
	}
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	lim, _ := memory.New()
	mw, err := p.Middleware(lim)
	if err != nil {
		tb.Fatal(err)
	}
	ip, err := keyfuncs.ClientIP()
	if err != nil {
		tb.Fatal(err)
	}
	key := keyfuncs.Header("X-API-Key")
	ny, _ := time.LoadLocation("America/New_York")
	rules := []middleware.Rule{
		{Rule: ratebudget.Rule{Name: "per-ip", Limit: bound.MaxLimit, Window: time.Hour}, Identity: ip},
		{Rule: ratebudget.Rule{Name: "hello", Limit: bound.MaxLimit, Window: time.Hour}, Identity: key},
		{Rule: ratebudget.Rule{Name: "daily", Algorithm: ratebudget.Calendar, Limit: bound.MaxLimit, Period: ratebudget.Day, Location: ny}, Identity: key},
	}
	lim2, _ := memory.New()
	plain, err := middleware.New(lim2, rules)
	if err != nil {
		tb.Fatal(err)
	}
	reqs = make([]*http.Request, tenants)
	for i := range reqs {
		reqs[i] = request("192.0.2."+strconv.Itoa(i%250)+":1000", "/api/hello", "X-API-Key", "key-"+strconv.Itoa(i))
	}
	fromPolicy, fixed = mw(noop), plain(noop)
	w := &discard{h: http.Header{}}
	for _, r := range reqs { // every budget exists before counting or timing
		fromPolicy.ServeHTTP(w, r)
		fixed.ServeHTTP(w, r)
	}
	return fromPolicy, fixed, reqs
}

// A request through a policy's middleware allocates no more than through the same rules
// built by hand: choosing its rules and plans allocates nothing.
func TestMiddlewareAllocs(t *testing.T) {
	if israce.Enabled {
		t.Skip("the race detector allocates; make test runs this without it")
	}
	fromPolicy, fixed, reqs := benchHandlers(t, 1000)
	w := &discard{h: http.Header{}}
	count := func(h http.Handler) float64 {
		i := 0
		return testing.AllocsPerRun(2000, func() {
			clear(w.h)
			h.ServeHTTP(w, reqs[i%len(reqs)])
			i++
		})
	}
	if got, want := count(fromPolicy), count(fixed); got > want {
		t.Errorf("a request through the policy's middleware allocates %v times, the same rules by hand %v", got, want)
	}
}

// BenchmarkPolicyMiddleware measures an admitted request under a policy of three rules
// and 10,000 tenants (policy: each rule matched, replaces checked, the tenant's plan
// looked up) against the same three rules built by hand, applying to every request
// (fixed), in one run: the ratio is what the policy's choice of rules and plans costs.
func BenchmarkPolicyMiddleware(b *testing.B) {
	fromPolicy, fixed, reqs := benchHandlers(b, 10_000)
	for _, tc := range []struct {
		name string
		h    http.Handler
	}{{"fixed", fixed}, {"policy", fromPolicy}} {
		b.Run(tc.name, func(b *testing.B) {
			w := &discard{h: http.Header{}}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				clear(w.h)
				tc.h.ServeHTTP(w, reqs[i%len(reqs)])
				i++
			}
		})
	}
}
