package headers_test

import (
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
)

// Each named style's value is its name, the one the demo's -headers flag takes.
func TestStyleNames(t *testing.T) {
	for s, want := range map[headers.Style]string{
		headers.XRateLimit: "x", headers.IETF: "ietf", headers.None: "none", headers.IETFDraft10: "ietf10",
	} {
		if string(s) != want {
			t.Errorf("style %q, want %q", s, want)
		}
	}
}

// The writers for custom handlers: status, Retry-After, no-store, no metadata, and a
// problem body naming the rule (JSON when the client asks for it).
func TestWriters(t *testing.T) {
	t.Parallel()
	refused := ratebudget.Decision{Rule: "api", Limit: 10,
		Outcome: ratebudget.Outcome{Remaining: 0, ResetAfter: 1500 * time.Millisecond, RetryAfter: 1500 * time.Millisecond}}
	for _, tc := range []struct {
		name       string
		write      func(*httptest.ResponseRecorder)
		code       int
		retryAfter string
		problem    map[string]any
	}{
		{"429", func(w *httptest.ResponseRecorder) {
			headers.WriteTooManyRequests(w, httptest.NewRequest("GET", "/", nil), refused)
		}, 429, "2", map[string]any{"policy": "api", "retry_after": 2.0, "violated-policies": []any{"api"}}},
		{"503", func(w *httptest.ResponseRecorder) {
			headers.WriteUnavailable(w, httptest.NewRequest("GET", "/", nil), 2500*time.Millisecond)
		}, 503, "3", map[string]any{"retry_after": 3.0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tc.write(rec)
			if rec.Code != tc.code || rec.Header().Get("Retry-After") != tc.retryAfter || rec.Header().Get("Cache-Control") != "no-store" {
				t.Fatalf("%d, Retry-After %q, Cache-Control %q; want %d, %q, no-store", rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get("Cache-Control"), tc.code, tc.retryAfter)
			}
			for _, h := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit", "Ratelimit-Policy"} {
				if v, ok := rec.Header()[h]; ok {
					t.Errorf("%s: %q written; the writers write no metadata", h, v)
				}
			}
			// The same refusal as JSON.
			rec = httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("Accept", "application/json")
			switch tc.name {
			case "429":
				headers.WriteTooManyRequests(rec, req, refused)
			case "503":
				headers.WriteUnavailable(rec, req, 2500*time.Millisecond)
			}
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
