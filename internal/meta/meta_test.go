package meta_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/meta"
	"github.com/ratebudget/ratebudget/internal/problem"
)

func TestWriteStyles(t *testing.T) {
	t.Parallel()
	in := meta.Info{Policy: "api", Limit: 100, Remaining: -3, Reset: 2500 * time.Millisecond, Window: time.Minute, Available: 2500 * time.Millisecond}
	for s, want := range map[headers.Style]map[string]string{
		headers.XRateLimit: {
			"X-RateLimit-Limit":     "100",
			"X-RateLimit-Remaining": "0", // negative values are clamped
			"X-RateLimit-Reset":     "3",
			"RateLimit-Policy":      "",
			"RateLimit":             "",
		},
		headers.IETF: {
			"X-RateLimit-Limit":     "",
			"X-RateLimit-Remaining": "",
			"X-RateLimit-Reset":     "",
			"RateLimit-Policy":      `"api";q=100;w=60`,
			"RateLimit":             `"api";r=0;t=2`, // draft-11: rounded down
		},
	} {
		h := http.Header{}
		meta.Write(h, s, []meta.Info{in}, 0)
		for k, v := range want {
			if got := h.Get(k); got != v {
				t.Errorf("%s: %s = %q, want %q", s, k, got, v)
			}
		}
	}
	// A caller's preformatted limit is copied as it is; one too long for a decimal
	// int64 is ignored and Limit formatted instead.
	for _, tc := range []struct{ text, want string }{{"100", "100"}, {"1000000000000", "1000000000000"}, {"123456789012345678901", "100"}} {
		pre := http.Header{}
		withText := in
		withText.LimitText = tc.text
		meta.Write(pre, headers.XRateLimit, []meta.Info{withText}, 0)
		if got := pre.Get("X-RateLimit-Limit"); got != tc.want || pre.Get("X-RateLimit-Remaining") != "0" || pre.Get("X-RateLimit-Reset") != "3" {
			t.Errorf("LimitText %q: %v, want X-RateLimit-Limit %q", tc.text, pre, tc.want)
		}
	}
	none := http.Header{}
	meta.Write(none, headers.None, []meta.Info{in}, 0)
	if len(none) != 0 {
		t.Errorf("None wrote %v", none)
	}
	// An undefined style writes nothing.
	undefined := headers.Style("both")
	meta.Write(none, undefined, []meta.Info{in}, 0)
	if len(none) != 0 {
		t.Errorf("%q wrote %v", undefined, none)
	}
}

func TestTooManyRequests(t *testing.T) {
	t.Parallel()
	in := meta.Info{Policy: "api", Limit: 5, Remaining: 0, Reset: 1200 * time.Millisecond, Window: time.Second, RetryAfter: 1200 * time.Millisecond}
	for _, tc := range []struct {
		accept, ctype string
	}{
		{"", "text/plain; charset=utf-8"},
		{"text/html", "text/plain; charset=utf-8"},
		{"application/json", "application/problem+json"},
		{"application/problem+json, */*;q=0.1", "application/problem+json"},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		meta.WriteTooManyRequests(rec, req, headers.XRateLimit, []meta.Info{in}, 0)
		if rec.Code != 429 || rec.Header().Get("Retry-After") != "2" || rec.Header().Get("Cache-Control") != "no-store" {
			t.Fatalf("Accept %q: %d %v", tc.accept, rec.Code, rec.Header())
		}
		if got := rec.Header().Get("Content-Type"); got != tc.ctype {
			t.Errorf("Accept %q: Content-Type %q, want %q", tc.accept, got, tc.ctype)
		}
		if tc.ctype == "application/problem+json" {
			var p problem.Problem
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Policy != "api" || p.RetryAfter != 2 || p.Status != 429 {
				t.Errorf("problem %+v %v", p, err)
			}
		}
	}
}

func TestUnavailableIsNot429(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	headers.WriteUnavailable(rec, httptest.NewRequest("GET", "/", nil), 300*time.Millisecond)
	if rec.Code != 503 || rec.Header().Get("Retry-After") != "1" || rec.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
}

func TestHeadHasNoBody(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	meta.WriteCostExceeded(rec, httptest.NewRequest("HEAD", "/", nil), headers.XRateLimit, []meta.Info{{Policy: "p", Limit: 3}}, 0, 4)
	if rec.Code != 413 || rec.Body.Len() != 0 || rec.Header().Get("Content-Length") == "0" || rec.Header().Get("Retry-After") != "" {
		t.Fatalf("%d %q %v", rec.Code, rec.Body.String(), rec.Header())
	}
}

func BenchmarkWrite(b *testing.B) {
	rules := []meta.Info{{Policy: "api", Limit: 100, Remaining: 42, Reset: 30 * time.Second, Window: time.Minute}}
	h := http.Header{}
	b.ReportAllocs()
	for b.Loop() {
		meta.Write(h, headers.XRateLimit, rules, 0)
	}
}

func TestWriteListsEveryRule(t *testing.T) {
	t.Parallel()
	rules := []meta.Info{
		{Policy: "per-client", Limit: 5, Remaining: 3, Reset: 50 * time.Second, Window: time.Minute, Available: 50 * time.Second},
		{Policy: "expensive", Limit: 100, Remaining: 99, Reset: 9500 * time.Millisecond, Window: 10 * time.Second, Unit: meta.UnitContentBytes},
	}
	for _, tc := range []struct {
		style             headers.Style
		x                 bool
		policy, ratelimit string
	}{
		{headers.IETF, false,
			`"per-client";q=5;w=60, "expensive";q=100;qu="content-bytes";w=10`,
			`"per-client";r=3;t=50, "expensive";r=99`}, // t unknown: omitted
		{headers.IETFDraft10, false,
			`"per-client";q=5;w=60, "expensive";q=100;qu="content-bytes";w=10`,
			`"per-client";r=3;t=50, "expensive";r=99`}, // draft-10 defines qu too
		{headers.XRateLimit, true, "", ""},
	} {
		h := http.Header{}
		meta.Write(h, tc.style, rules, 0)
		if got := h.Get("RateLimit-Policy"); got != tc.policy {
			t.Errorf("%v: RateLimit-Policy %s, want %s", tc.style, got, tc.policy)
		}
		if got := h.Get("RateLimit"); got != tc.ratelimit {
			t.Errorf("%v: RateLimit %s, want %s", tc.style, got, tc.ratelimit)
		}
		if got := h.Get("X-RateLimit-Remaining"); (got == "3") != tc.x || tc.x && (h.Get("X-RateLimit-Limit") != "5" || h.Get("X-RateLimit-Reset") != "50") {
			t.Errorf("%v: X-RateLimit-* %v, want the reported rule's: %v", tc.style, h, tc.x)
		}
	}
}

func TestTooManyRequestsSaysWhatHappened(t *testing.T) {
	t.Parallel()
	decode := func(rec *httptest.ResponseRecorder) problem.Problem {
		t.Helper()
		var p problem.Problem
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("Accept", "application/json")
	// Cost 3 with 2 units left: not "exhausted".
	rec := httptest.NewRecorder()
	meta.WriteTooManyRequests(rec, req, headers.XRateLimit, []meta.Info{{Policy: "api", Limit: 5, Remaining: 2, Cost: 3, RetryAfter: time.Second}}, 0)
	p := decode(rec)
	if want := `the cost 3 of this request does not fit the 2 units left in rate limit "api"; retry in 1s`; p.Detail != want || p.Cost != 3 || p.Remaining != 2 {
		t.Errorf("cost that does not fit: %+v, want detail %q", p, want)
	}
	if len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "api" {
		t.Errorf("violated-policies %v", p.ViolatedPolicies)
	}
	if !strings.Contains(rec.Body.String(), `"violated-policies":["api"]`) {
		t.Errorf("body %s lacks the violated-policies member", rec.Body)
	}
	// Nothing left: exhausted.
	rec = httptest.NewRecorder()
	meta.WriteTooManyRequests(rec, req, headers.XRateLimit, []meta.Info{{Policy: "api", Limit: 5, Remaining: 0, Cost: 3, RetryAfter: time.Second}}, 0)
	if p := decode(rec); p.Detail != `rate limit "api" exhausted; retry in 1s` {
		t.Errorf("exhausted: %q", p.Detail)
	}
	// No metadata (an authentication route): the remaining count is not told.
	rec = httptest.NewRecorder()
	meta.WriteTooManyRequests(rec, req, headers.None, []meta.Info{{Policy: "login", Limit: 5, Remaining: 2, Cost: 3, RetryAfter: time.Second}}, 0)
	if p := decode(rec); strings.Contains(p.Detail, "2") || p.Remaining != 0 || !strings.Contains(p.Detail, "does not fit") {
		t.Errorf("style None: %+v", p)
	}
	// Several rules: every refusing rule is named; the reported one decides the wait.
	rec = httptest.NewRecorder()
	meta.WriteTooManyRequests(rec, req, headers.IETF, []meta.Info{
		{Policy: "outer", Limit: 5, Remaining: 0, RetryAfter: 3 * time.Second, Violated: true},
		{Policy: "ok", Limit: 9, Remaining: 8},
		{Policy: "inner", Limit: 2, Remaining: 0, RetryAfter: 9 * time.Second, Violated: true},
	}, 2)
	p = decode(rec)
	if rec.Header().Get("Retry-After") != "9" || p.Policy != "inner" || strings.Join(p.ViolatedPolicies, ",") != "outer,inner" {
		t.Errorf("several rules: %v %+v", rec.Header(), p)
	}
	if got := rec.Header().Get("RateLimit"); got != `"outer";r=0, "ok";r=8, "inner";r=0` {
		t.Errorf("RateLimit %s", got)
	}
}

func TestWriteInvalidNamesThePart(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	meta.WriteInvalid(rec, httptest.NewRequest("GET", "/", nil), "cost", "cost must be a positive integer")
	if rec.Code != 400 || rec.Body.String() != "Bad Request: rate-limit cost: cost must be a positive integer\n" || rec.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("%d %q %v", rec.Code, rec.Body, rec.Header())
	}
	rec = httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("Accept", "application/problem+json")
	meta.WriteInvalid(rec, req, "identity", "identity could not be determined")
	var p problem.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Invalid != "identity" || p.Status != 400 || p.Detail != "rate-limit identity: identity could not be determined" {
		t.Fatalf("%+v %v", p, err)
	}
}

// The middleware's own 400 and 413: status, no Retry-After, no-store, no metadata (the
// 413 under headers.None, as the middleware sends it), and a problem body naming the
// part or the rule (JSON when the client asks for it).
func TestInvalidAndCostExceeded(t *testing.T) {
	t.Parallel()
	exceeded := meta.Info{Policy: "api", Limit: 10, Window: time.Minute}
	for _, tc := range []struct {
		name    string
		write   func(http.ResponseWriter, *http.Request)
		code    int
		problem map[string]any
	}{
		{"413", func(w http.ResponseWriter, r *http.Request) {
			meta.WriteCostExceeded(w, r, headers.None, []meta.Info{exceeded}, 0, 12)
		}, 413, map[string]any{"policy": "api", "capacity": 10.0, "cost": 12.0,
			"detail": `cost 12 exceeds the capacity 10 of rate limit "api"; it can never be admitted`}},
		{"400", func(w http.ResponseWriter, r *http.Request) {
			meta.WriteInvalid(w, r, "identity", "header X-Api-Key is missing or empty")
		}, 400, map[string]any{"invalid": "identity", "detail": "rate-limit identity: header X-Api-Key is missing or empty"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tc.write(rec, httptest.NewRequest("GET", "/", nil))
			if rec.Code != tc.code || rec.Header().Get("Retry-After") != "" || rec.Header().Get("Cache-Control") != "no-store" {
				t.Fatalf("%d, Retry-After %q, Cache-Control %q; want %d, none, no-store", rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get("Cache-Control"), tc.code)
			}
			for _, h := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit", "Ratelimit-Policy"} {
				if v, ok := rec.Header()[h]; ok {
					t.Errorf("%s: %q written; these answers carry no metadata", h, v)
				}
			}
			// The same answer as JSON.
			rec = httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("Accept", "application/json")
			tc.write(rec, req)
			var p map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
				t.Fatalf("body %q: %v", rec.Body.String(), err)
			}
			if p["status"] != float64(tc.code) {
				t.Errorf("status member %v, want %d", p["status"], tc.code)
			}
			for k, want := range tc.problem {
				got, _ := json.Marshal(p[k])
				w, _ := json.Marshal(want)
				if string(got) != string(w) {
					t.Errorf("member %s = %s, want %s (body %s)", k, got, w, rec.Body.String())
				}
			}
		})
	}
}

// Draft-10 defines qu as draft-11 does, and its t is the number of seconds until
// additional quota is made available (not until the budget is whole), which a
// Retry-After must not precede. A token bucket refusing with one token due in 1s and
// full in 10s tells draft-10 clients t=1, as its Retry-After does.
func TestDraft10Fields(t *testing.T) {
	t.Parallel()
	in := meta.Info{
		Policy: "bytes", Limit: 10, Remaining: 0, Window: 10 * time.Second,
		Reset: 10 * time.Second, Available: 500 * time.Millisecond, RetryAfter: 500 * time.Millisecond,
		Unit: meta.UnitContentBytes,
	}
	rec := httptest.NewRecorder()
	meta.WriteTooManyRequests(rec, httptest.NewRequest("GET", "/", nil), headers.IETFDraft10, []meta.Info{in}, 0)
	h := rec.Header()
	if got, want := h.Get("RateLimit-Policy"), `"bytes";q=10;qu="content-bytes";w=10`; got != want {
		t.Errorf("RateLimit-Policy %s, want %s", got, want)
	}
	// Rounded up: after t seconds more quota is available.
	if got, want := h.Get("RateLimit"), `"bytes";r=0;t=1`; got != want {
		t.Errorf("RateLimit %s, want %s", got, want)
	}
	if got := h.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %s, want 1", got)
	}
	// When the time until more quota is not known (a rolling window), t is omitted: it
	// is optional, and the time until the budget is whole would overstate it.
	unknown := meta.Info{Policy: "roll", Limit: 10, Remaining: 3, Window: time.Minute, Reset: time.Minute}
	h = http.Header{}
	meta.Write(h, headers.IETFDraft10, []meta.Info{unknown}, 0)
	if got, want := h.Get("RateLimit"), `"roll";r=3`; got != want {
		t.Errorf("unknown Available: RateLimit %s, want %s", got, want)
	}
	h = http.Header{}
	meta.Write(h, headers.XRateLimit, []meta.Info{unknown}, 0)
	if got := h.Get("X-RateLimit-Reset"); got != "60" {
		t.Errorf("X-RateLimit-Reset %s, want 60", got)
	}
}

// TestValuesShared: the responses written with one Values share its memory, and each
// keeps its own values while later ones are written, across chunks, for one rule and
// several, in every style; a value a handler appends to is copied, not written over
// the next response's. Each response equals the one Write without a Values writes.
func TestValuesShared(t *testing.T) {
	t.Parallel()
	var v meta.Values
	type written struct{ got, want http.Header }
	var all []written
	for i := range 600 {
		s := []headers.Style{headers.XRateLimit, headers.IETF, headers.None, headers.IETFDraft10}[i%4]
		rules := []meta.Info{{Policy: "api", Limit: int64(1000 + i), Remaining: int64(i), Reset: time.Duration(i) * time.Second, Window: time.Minute, Available: time.Second}}
		if i%3 == 0 {
			rules = append(rules, meta.Info{Policy: strings.Repeat("p", i%70), Limit: 7, Remaining: int64(i % 7), Window: time.Hour, Unreported: i%2 == 0})
		}
		got, want := http.Header{}, http.Header{}
		v.Write(got, s, rules, len(rules)-1)
		meta.Write(want, s, rules, len(rules)-1)
		got["X-Ratelimit-Limit"] = append(got["X-Ratelimit-Limit"], "appended")
		want["X-Ratelimit-Limit"] = append(want["X-Ratelimit-Limit"], "appended")
		all = append(all, written{got, want})
	}
	for i, w := range all {
		if len(w.got) != len(w.want) {
			t.Fatalf("response %d: %d fields, want %d", i, len(w.got), len(w.want))
		}
		for k, vals := range w.want {
			if strings.Join(w.got[k], "|") != strings.Join(vals, "|") {
				t.Fatalf("response %d: %s = %q, want %q", i, k, w.got[k], vals)
			}
		}
	}
}

// TestValuesFreed: the chunks of a Values whose responses are gone are freed; none keeps
// an older one alive. 100,000 responses fill about 2,500 chunks (20 MB) of which only
// the current one must stay.
func TestValuesFreed(t *testing.T) {
	var v meta.Values
	in := []meta.Info{{Policy: "api", Limit: 1 << 40, Remaining: 1 << 39, Reset: time.Hour, Window: time.Hour, Available: time.Second}}
	write := func(n int) {
		for i := range n {
			in[0].Remaining = int64(i)
			v.Write(http.Header{}, headers.IETF, in, 0)
		}
	}
	write(1000)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	write(100_000)
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 4<<20 {
		t.Errorf("the heap grew by %d bytes over 100,000 responses whose headers are gone, want at most 4 MiB", grown)
	}
	runtime.KeepAlive(&v)
}

// A rule decided under a plan names it: RateLimit-Policy's ratebudget-plan parameter,
// and the refusal's body (member plan, and the text's detail).
func TestPlanNamed(t *testing.T) {
	in := meta.Info{Policy: "api", Plan: "free", Limit: 5, Window: time.Minute, RetryAfter: 3 * time.Second, Violated: true}
	h := http.Header{}
	meta.Write(h, headers.IETF, []meta.Info{in, {Policy: "per-ip", Limit: 100, Remaining: 97, Window: time.Minute}}, 0)
	if got, want := h.Get("RateLimit-Policy"), `"api";q=5;w=60;ratebudget-plan="free", "per-ip";q=100;w=60`; got != want {
		t.Fatalf("RateLimit-Policy %q, want %q", got, want)
	}
	w := httptest.NewRecorder()
	meta.WriteTooManyRequests(w, httptest.NewRequest("GET", "/", nil), headers.XRateLimit, []meta.Info{in}, 0)
	if got, want := w.Body.String(), "Too Many Requests: rate limit \"api\" (plan \"free\") exhausted; retry in 3s\n"; got != want {
		t.Fatalf("body %q, want %q", got, want)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Accept", "application/json")
	w = httptest.NewRecorder()
	meta.WriteCostExceeded(w, r, headers.None, []meta.Info{in}, 0, 9)
	if !strings.Contains(w.Body.String(), `"plan":"free"`) || !strings.Contains(w.Body.String(), `rate limit \"api\" (plan \"free\")`) {
		t.Fatalf("413 body %s does not name the plan", w.Body.String())
	}
}
