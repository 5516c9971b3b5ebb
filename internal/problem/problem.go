// Package problem writes the bodies of the responses that package headers and the
// middleware send instead of the handler's: RFC 9457 problem details as
// application/problem+json when the client prefers JSON, short text/plain otherwise.
package problem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Problem types (the type member). The first two are the types proposed by
// draft-ietf-httpapi-ratelimit-headers.
const (
	QuotaExceeded       = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	ReducedCapacity     = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
	CostExceedsCapacity = "urn:ratebudget:problem:cost-exceeds-capacity"
	InvalidRequest      = "urn:ratebudget:problem:unidentified-request"
	// Blank is the type of a problem with no semantics beyond its status code (RFC 9457
	// §4.2.1), such as a 500 for a server-side mistake; its title is the status phrase.
	Blank = "about:blank"
)

// Problem is an RFC 9457 problem details object, with the extension members the
// responses use.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Policy is the reported rule's name (the refusing one for a 429 or 413).
	Policy string `json:"policy,omitempty"`
	// Plan is the plan the reported rule decided the request under, when it has plans.
	Plan string `json:"plan,omitempty"`
	// ViolatedPolicies names every rule that refused the request (the quota-exceeded
	// problem type's member, draft-ietf-httpapi-ratelimit-headers-11 §5.1).
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	// RetryAfter is the Retry-After value, in seconds.
	RetryAfter int64 `json:"retry_after,omitempty"`
	// Cost is the request's cost; Remaining what the refusing rule had left (429), or
	// Capacity the most the rule can ever admit (413).
	Cost      int64 `json:"cost,omitempty"`
	Remaining int64 `json:"remaining,omitempty"`
	Capacity  int64 `json:"capacity,omitempty"`
	// Invalid names what could not be determined for a 400: "identity", "scope", "plan"
	// or "cost".
	Invalid string `json:"invalid,omitempty"`
}

// Write writes p with status p.Status: as application/problem+json when the client
// prefers JSON ([AcceptsJSON] on r's Accept fields), as short text/plain otherwise. It
// sets Cache-Control: no-store, because refusals describe one moment and must not be
// cached (RFC 6585 §4); so no cache keeps one, and the body's dependence on Accept needs
// no Vary. Headers already set on w (Retry-After, metadata) are kept. Nothing is written
// for HEAD beyond the headers.
func Write(w http.ResponseWriter, r *http.Request, p Problem) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	var body []byte
	if AcceptsJSON(r.Header.Values("Accept")) {
		h.Set("Content-Type", "application/problem+json")
		body, _ = json.Marshal(p) // a struct of strings and ints: cannot fail
		body = append(body, '\n')
	} else {
		h.Set("Content-Type", "text/plain; charset=utf-8")
		text := p.Title
		if p.Detail != "" {
			text += ": " + p.Detail
		}
		body = []byte(text + "\n")
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(p.Status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

// Seconds converts d to whole seconds, rounded up; zero and negative durations give 0.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second) // not (d + time.Second - 1) / time.Second: that overflows
	if d%time.Second != 0 {
		s++
	}
	return s
}

// RetryAfterSeconds is the Retry-After value for d: whole seconds, rounded up, at least
// 1. Rounding down would invite a retry that is certain to be refused.
func RetryAfterSeconds(d time.Duration) int64 { return max(Seconds(d), 1) }
