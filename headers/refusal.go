package headers

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Problem types used in application/problem+json bodies (RFC 9457). The first two are the
// types proposed by draft-ietf-httpapi-ratelimit-headers.
const (
	ProblemQuotaExceeded    = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	ProblemReducedCapacity  = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
	ProblemCostExceedsLimit = "urn:ratebudget:problem:cost-exceeds-capacity"
	ProblemInvalidRequest   = "urn:ratebudget:problem:unidentified-request"
)

// Parts of a request's budget that can fail to be determined, for [WriteInvalid] and
// [Problem].Invalid.
const (
	PartIdentity = "identity"
	PartScope    = "scope"
	PartCost     = "cost"
)

// Problem is an RFC 9457 problem details object, with the extension members this package
// uses.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Policy is the reported rule's name (the refusing one for a 429 or 413).
	Policy string `json:"policy,omitempty"`
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
	// Invalid names what could not be determined for a 400: "identity", "scope" or "cost".
	Invalid string `json:"invalid,omitempty"`
}

// WriteProblem writes p with status p.Status: as application/problem+json when the client
// prefers JSON ([AcceptsJSON]), as short text/plain otherwise. It sets Cache-Control:
// no-store, because refusals describe one moment and must not be cached (RFC 6585 §4);
// so no cache keeps one, and the body's dependence on Accept needs no Vary. Headers
// already set on w (Retry-After, metadata) are kept. Nothing is written for HEAD beyond
// the headers.
func WriteProblem(w http.ResponseWriter, r *http.Request, p Problem) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	var body []byte
	if AcceptsJSON(r) {
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

// WriteTooManyRequests writes the 429 refusal for a caller over its allowance (RFC 6585
// §4) under one rule. It is [WriteTooManyRequestsRules] with one rule.
func WriteTooManyRequests(w http.ResponseWriter, r *http.Request, s Style, in Info) {
	in.Violated = true
	WriteTooManyRequestsRules(w, r, s, []Info{in}, 0)
}

// WriteTooManyRequestsRules writes the 429 refusal of a request decided under several
// rules, rules[reported] being the refusing rule with the longest wait: Retry-After in
// whole seconds (rounded up, at least 1) from it, Cache-Control: no-store, the metadata
// of style s for every rule ([WriteRules]), and a body naming what happened. A refusal
// of a cost larger than what remains (cost 3, 2 units left) says so, because the client
// sees a positive remaining count; a refusal with nothing left says the limit is
// exhausted. The problem's violated-policies lists every rule marked Violated (the
// reported one when none is).
func WriteTooManyRequestsRules(w http.ResponseWriter, r *http.Request, s Style, rules []Info, reported int) {
	if reported < 0 || reported >= len(rules) {
		reported = 0
		if len(rules) == 0 {
			rules = []Info{{}}
		}
	}
	in := &rules[reported]
	WriteRules(w.Header(), s, rules, reported)
	secs := RetryAfterSeconds(in.RetryAfter)
	w.Header().Set(RetryAfter, strconv.FormatInt(secs, 10))
	wait := "; retry in " + strconv.FormatInt(secs, 10) + "s"
	p := Problem{
		Type:       ProblemQuotaExceeded,
		Title:      "Too Many Requests",
		Status:     http.StatusTooManyRequests,
		Policy:     in.Policy,
		RetryAfter: secs,
	}
	rem := max(in.Remaining, 0)
	if in.Cost > 1 && rem > 0 && s != None {
		// Remaining is only told when the metadata tells it too.
		p.Detail = "the cost " + strconv.FormatInt(in.Cost, 10) + " of this request does not fit the " +
			strconv.FormatInt(rem, 10) + " units left in rate limit " + strconv.Quote(in.Policy) + wait
		p.Cost, p.Remaining = in.Cost, rem
	} else if in.Cost > 1 && rem > 0 {
		p.Detail = "the cost " + strconv.FormatInt(in.Cost, 10) + " of this request does not fit what is left in rate limit " + strconv.Quote(in.Policy) + wait
		p.Cost = in.Cost
	} else {
		p.Detail = "rate limit " + strconv.Quote(in.Policy) + " exhausted" + wait
	}
	for i := range rules {
		if rules[i].Violated {
			p.ViolatedPolicies = append(p.ViolatedPolicies, rules[i].Policy)
		}
	}
	if p.ViolatedPolicies == nil {
		p.ViolatedPolicies = []string{in.Policy}
	}
	WriteProblem(w, r, p)
}

// WriteCostExceeded writes the refusal for a request whose cost exceeds the capacity of a
// rule: it can never be admitted, so it is answered 413 Content Too Large without
// Retry-After (a 429 would invite pointless retries).
func WriteCostExceeded(w http.ResponseWriter, r *http.Request, s Style, in Info, cost int64) {
	in.Violated = true
	WriteCostExceededRules(w, r, s, []Info{in}, 0, cost)
}

// WriteCostExceededRules is [WriteCostExceeded] for a request under several rules,
// rules[reported] being the rule whose capacity the cost exceeds; the metadata lists
// every rule ([WriteRules]).
func WriteCostExceededRules(w http.ResponseWriter, r *http.Request, s Style, rules []Info, reported int, cost int64) {
	if reported < 0 || reported >= len(rules) {
		reported = 0
		if len(rules) == 0 {
			rules = []Info{{}}
		}
	}
	in := &rules[reported]
	WriteRules(w.Header(), s, rules, reported)
	p := Problem{
		Type:     ProblemCostExceedsLimit,
		Title:    "Request Cost Exceeds Capacity",
		Status:   http.StatusRequestEntityTooLarge,
		Detail:   "cost " + strconv.FormatInt(cost, 10) + " exceeds the capacity " + strconv.FormatInt(in.Limit, 10) + " of rate limit " + strconv.Quote(in.Policy) + "; it can never be admitted",
		Policy:   in.Policy,
		Cost:     cost,
		Capacity: in.Limit,
	}
	for i := range rules {
		if rules[i].Violated {
			p.ViolatedPolicies = append(p.ViolatedPolicies, rules[i].Policy)
		}
	}
	if p.ViolatedPolicies == nil {
		p.ViolatedPolicies = []string{in.Policy}
	}
	WriteProblem(w, r, p)
}

// WriteUnavailable writes 503 Service Unavailable for a budget store that cannot decide,
// under a fail-closed policy: the caller exceeded nothing, so this is never a 429. The
// body names the condition without store details; retryAfter (rounded up, at least 1s)
// is sent as Retry-After.
func WriteUnavailable(w http.ResponseWriter, r *http.Request, retryAfter time.Duration) {
	secs := RetryAfterSeconds(retryAfter)
	w.Header().Set(RetryAfter, strconv.FormatInt(secs, 10))
	WriteProblem(w, r, Problem{
		Type:       ProblemReducedCapacity,
		Title:      "Service Unavailable",
		Status:     http.StatusServiceUnavailable,
		Detail:     "the rate-limit budget store is unavailable; retry in " + strconv.FormatInt(secs, 10) + "s",
		RetryAfter: secs,
	})
}

// WriteUnidentified writes 400 Bad Request for a request whose rate-limit identity,
// scope or cost could not be determined, with detail as the body's explanation. Prefer
// [WriteInvalid], which names the part at fault.
func WriteUnidentified(w http.ResponseWriter, r *http.Request, detail string) {
	WriteProblem(w, r, Problem{
		Type:   ProblemInvalidRequest,
		Title:  "Bad Request",
		Status: http.StatusBadRequest,
		Detail: detail,
	})
}

// WriteInvalid writes 400 Bad Request for a request whose rate-limit identity, scope or
// cost (part: [PartIdentity], [PartScope] or [PartCost]) could not be determined, for
// reason, a client-facing explanation such as "cost must be a positive integer" (never
// an internal error's text). The body reads "rate-limit <part>: <reason>" and, as JSON,
// carries part in the member "invalid". Such a request is never counted in a shared
// budget.
func WriteInvalid(w http.ResponseWriter, r *http.Request, part, reason string) {
	WriteProblem(w, r, Problem{
		Type:    ProblemInvalidRequest,
		Title:   "Bad Request",
		Status:  http.StatusBadRequest,
		Detail:  "rate-limit " + part + ": " + reason,
		Invalid: part,
	})
}
