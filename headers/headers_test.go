package headers_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/headers"
)

func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{0, 1}, {-time.Second, 1}, {time.Nanosecond, 1}, {999 * time.Millisecond, 1},
		{time.Second, 1}, {time.Second + time.Millisecond, 2}, {59*time.Second + 1, 60}, {time.Hour, 3600},
	} {
		if got := headers.RetryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
	if got := headers.Seconds(0); got != 0 {
		t.Errorf("Seconds(0) = %d, want 0", got)
	}
	if got := headers.Seconds(1500 * time.Millisecond); got != 2 {
		t.Errorf("Seconds(1.5s) = %d, want 2", got)
	}
}

func TestWriteStyles(t *testing.T) {
	t.Parallel()
	in := headers.Info{Policy: "api", Limit: 100, Remaining: -3, Reset: 2500 * time.Millisecond, Window: time.Minute}
	h := http.Header{}
	headers.Write(h, headers.Both, in)
	want := map[string]string{
		"X-RateLimit-Limit":     "100",
		"X-RateLimit-Remaining": "0", // negative values are clamped
		"X-RateLimit-Reset":     "3",
		"RateLimit-Policy":      `"api";q=100;w=60`,
		"RateLimit":             `"api";r=0;t=3`,
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	// A caller's preformatted limit is copied as it is; one too long for a decimal
	// int64 is ignored and Limit formatted instead.
	for _, tc := range []struct{ text, want string }{{"100", "100"}, {"1000000000000", "1000000000000"}, {"123456789012345678901", "100"}} {
		pre := http.Header{}
		withText := in
		withText.LimitText = tc.text
		headers.Write(pre, headers.XRateLimit, withText)
		if got := pre.Get("X-RateLimit-Limit"); got != tc.want || pre.Get("X-RateLimit-Remaining") != "0" || pre.Get("X-RateLimit-Reset") != "3" {
			t.Errorf("LimitText %q: %v, want X-RateLimit-Limit %q", tc.text, pre, tc.want)
		}
	}
	none := http.Header{}
	headers.Write(none, headers.None, in)
	if len(none) != 0 {
		t.Errorf("None wrote %v", none)
	}
	for _, s := range []string{"x", "ietf", "both", "none"} {
		st, ok := headers.ParseStyle(s)
		if !ok || st.String() != s {
			t.Errorf("ParseStyle(%q) = %v %v", s, st, ok)
		}
	}
	if _, ok := headers.ParseStyle("X"); ok {
		t.Error("ParseStyle accepted X")
	}
}

func TestTooManyRequests(t *testing.T) {
	t.Parallel()
	in := headers.Info{Policy: "api", Limit: 5, Remaining: 0, Reset: 1200 * time.Millisecond, Window: time.Second, RetryAfter: 1200 * time.Millisecond}
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
		headers.WriteTooManyRequests(rec, req, headers.XRateLimit, in)
		if rec.Code != 429 || rec.Header().Get("Retry-After") != "2" || rec.Header().Get("Cache-Control") != "no-store" {
			t.Fatalf("Accept %q: %d %v", tc.accept, rec.Code, rec.Header())
		}
		if got := rec.Header().Get("Content-Type"); got != tc.ctype {
			t.Errorf("Accept %q: Content-Type %q, want %q", tc.accept, got, tc.ctype)
		}
		if tc.ctype == "application/problem+json" {
			var p headers.Problem
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
	headers.WriteCostExceeded(rec, httptest.NewRequest("HEAD", "/", nil), headers.XRateLimit, headers.Info{Policy: "p", Limit: 3}, 4)
	if rec.Code != 413 || rec.Body.Len() != 0 || rec.Header().Get("Content-Length") == "0" || rec.Header().Get("Retry-After") != "" {
		t.Fatalf("%d %q %v", rec.Code, rec.Body.String(), rec.Header())
	}
}

func BenchmarkWrite(b *testing.B) {
	in := headers.Info{Policy: "api", Limit: 100, Remaining: 42, Reset: 30 * time.Second, Window: time.Minute}
	h := http.Header{}
	b.ReportAllocs()
	for b.Loop() {
		headers.Write(h, headers.XRateLimit, in)
	}
}

func TestStructuredFieldValues(t *testing.T) {
	t.Parallel()
	if got, want := headers.PolicyValue("a\"b\\c\x01", 7, 1500*time.Millisecond), `"a\"b\\c";q=7;w=2`; got != want {
		t.Errorf("PolicyValue = %s, want %s", got, want)
	}
	if got, want := headers.RateLimitValue("api", -1, 0), `"api";r=0;t=0`; got != want {
		t.Errorf("RateLimitValue = %s, want %s", got, want)
	}
}
