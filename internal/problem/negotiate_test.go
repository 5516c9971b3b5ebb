package problem_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ratebudget/ratebudget/internal/problem"
)

func TestAcceptsJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		accept string
		json   bool
	}{
		{"", false},
		{"*/*", false}, // curl and browsers: text
		{"application/json", true},
		{"application/problem+json", true},
		{"APPLICATION/JSON", true},
		{"application/*", true},
		{"application/json, text/plain", true}, // equal weights, JSON named
		{"text/plain, application/json", true},
		{"application/json;q=0, text/plain", false},
		{"application/json;q=0", false},
		{"application/json; q=0.000", false},
		{"application/json;q=0.5, text/plain", false},
		{"application/json;q=0.5, text/plain;q=0.4", true},
		{"application/json;q=0.5, */*", false}, // everything else preferred
		{"application/json, */*;q=0.1", true},
		{"application/problem+json, */*;q=0.1", true},
		{"application/x-ndjson", false},
		{"application/ld+json", false},
		{"application/vnd.api+json", false},
		{"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", false},
		{"application/*;q=0.9, text/*;q=0.8", true},
		{"text/*, application/json;q=0.9", false},
		{"application/json;q=2", false},          // not a qvalue: ignored
		{"application/json;q=1.5", false},        // not a qvalue
		{"application/json;q=1.000", true},       // the longest valid 1
		{"application/json;q=0.0001", false},     // four decimals: ignored
		{"application/json;q=", false},           // empty weight: ignored
		{"application/json;charset=utf-8", true}, // other parameters do not matter
		{`application/json;x="a,b;q=0", text/plain;q=0.5`, true},
		{"application/json ; Q = 0.8 , text/plain;q=0.7", true},
		{"json", false},
		{"/json", false},
		{"application/", false},
		{"*/json", false},
		{",,, ;; ,", false},
		{"application/json\x00", false},
	} {
		if got := problem.AcceptsJSON([]string{tc.accept}); got != tc.json {
			t.Errorf("Accept %q: AcceptsJSON = %v, want %v", tc.accept, got, tc.json)
		}
	}
	// Several Accept fields form one list.
	if !problem.AcceptsJSON([]string{"text/plain;q=0.5", "application/json"}) {
		t.Error("two fields: want JSON")
	}
	if problem.AcceptsJSON([]string{"application/json", "application/json;q=0, text/plain"}) != true {
		// The same range twice: the higher weight counts (RFC 9110 leaves it open).
		t.Error("repeated range: want the higher weight")
	}
}

func TestWriteNegotiates(t *testing.T) {
	t.Parallel()
	for accept, ctype := range map[string]string{
		"application/json;q=0, text/plain": "text/plain; charset=utf-8",
		"application/x-ndjson":             "text/plain; charset=utf-8",
		"application/json":                 "application/problem+json",
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("Accept", accept)
		problem.Write(rec, req, problem.Problem{Type: problem.InvalidRequest, Title: "Bad Request", Status: 400, Detail: "rate-limit cost: cost must be a positive integer", Invalid: "cost"})
		if got := rec.Header().Get("Content-Type"); got != ctype {
			t.Errorf("Accept %q: Content-Type %q, want %q", accept, got, ctype)
		}
	}
}

func FuzzAcceptsJSON(f *testing.F) {
	for _, s := range []string{"", "*/*", "application/json;q=0.5", `a/b;x="\"",c/d;q=1.000`, "\"", "a/b;q=0.", "\\"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := problem.AcceptsJSON([]string{s})
		// Never JSON unless the header names JSON, application/* or */*.
		if got && !strings.Contains(strings.ToLower(s), "json") && !strings.Contains(s, "/*") {
			t.Fatalf("%q: JSON without naming it", s)
		}
	})
}
