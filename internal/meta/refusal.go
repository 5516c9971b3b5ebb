package meta

import (
	"net/http"
	"strconv"

	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/problem"
)

// WriteTooManyRequests writes the 429 refusal for a caller over its allowance (RFC 6585
// §4), for a request decided under rules, rules[reported] being the refusing rule with
// the longest wait (a request under one rule passes a one-element slice and 0):
// Retry-After in whole seconds (rounded up, at least 1) from it, Cache-Control:
// no-store, the metadata of style s for every rule ([Write]), and a body naming what
// happened. A refusal of a cost larger than what remains (cost 3, 2 units left) says so,
// because the client sees a positive remaining count; a refusal with nothing left says
// the limit is exhausted. The problem's violated-policies lists every rule marked
// Violated (the reported one when none is). An out-of-range reported index reports
// rules[0].
func WriteTooManyRequests(w http.ResponseWriter, r *http.Request, s headers.Style, rules []Info, reported int) {
	rules, reported = clampReported(rules, reported)
	in := &rules[reported]
	Write(w.Header(), s, rules, reported)
	secs := problem.RetryAfterSeconds(in.RetryAfter)
	w.Header().Set(keyRetryAfter, strconv.FormatInt(secs, 10))
	wait := "; retry in " + strconv.FormatInt(secs, 10) + "s"
	p := problem.Problem{
		Type:       problem.QuotaExceeded,
		Title:      "Too Many Requests",
		Status:     http.StatusTooManyRequests,
		Policy:     in.Policy,
		Plan:       in.Plan,
		RetryAfter: secs,
	}
	name := ruleName(in)
	rem := max(in.Remaining, 0)
	if in.Cost > 1 && rem > 0 && s != headers.None {
		// Remaining is only told when the metadata tells it too.
		p.Detail = "the cost " + strconv.FormatInt(in.Cost, 10) + " of this request does not fit the " +
			strconv.FormatInt(rem, 10) + " units left in rate limit " + name + wait
		p.Cost, p.Remaining = in.Cost, rem
	} else if in.Cost > 1 && rem > 0 {
		p.Detail = "the cost " + strconv.FormatInt(in.Cost, 10) + " of this request does not fit what is left in rate limit " + name + wait
		p.Cost = in.Cost
	} else {
		p.Detail = "rate limit " + name + " exhausted" + wait
	}
	p.ViolatedPolicies = violated(rules, in)
	problem.Write(w, r, p)
}

// WriteCostExceeded writes the refusal for a request whose cost exceeds the capacity of
// rules[reported]: it can never be admitted, so it is answered 413 Content Too Large
// without Retry-After (a 429 would invite pointless retries). The metadata of style s
// lists every rule ([Write]); a request under one rule passes a one-element slice and 0.
// An out-of-range reported index reports rules[0].
func WriteCostExceeded(w http.ResponseWriter, r *http.Request, s headers.Style, rules []Info, reported int, cost int64) {
	rules, reported = clampReported(rules, reported)
	in := &rules[reported]
	Write(w.Header(), s, rules, reported)
	name := ruleName(in)
	p := problem.Problem{
		Type:     problem.CostExceedsCapacity,
		Title:    "Request Cost Exceeds Capacity",
		Status:   http.StatusRequestEntityTooLarge,
		Detail:   "cost " + strconv.FormatInt(cost, 10) + " exceeds the capacity " + strconv.FormatInt(in.Limit, 10) + " of rate limit " + name + "; it can never be admitted",
		Policy:   in.Policy,
		Plan:     in.Plan,
		Cost:     cost,
		Capacity: in.Limit,
	}
	p.ViolatedPolicies = violated(rules, in)
	problem.Write(w, r, p)
}

// WriteInvalid writes 400 Bad Request for a request whose rate-limit identity, scope,
// plan or cost (part: "identity", "scope", "plan" or "cost") could not be determined,
// for reason, a client-facing explanation such as "cost must be a positive integer"
// (never an internal error's text). The body reads "rate-limit <part>: <reason>" and, as
// JSON, carries part in the member "invalid"; Cache-Control: no-store, no metadata.
func WriteInvalid(w http.ResponseWriter, r *http.Request, part, reason string) {
	problem.Write(w, r, problem.Problem{
		Type:    problem.InvalidRequest,
		Title:   "Bad Request",
		Status:  http.StatusBadRequest,
		Detail:  "rate-limit " + part + ": " + reason,
		Invalid: part,
	})
}

// clampReported makes reported a valid index of rules, which it makes non-empty.
func clampReported(rules []Info, reported int) ([]Info, int) {
	if reported >= 0 && reported < len(rules) {
		return rules, reported
	}
	if len(rules) == 0 {
		rules = []Info{{}}
	}
	return rules, 0
}

// ruleName is the rule of in as a refusal's detail names it: quoted, with its plan.
func ruleName(in *Info) string {
	if in.Plan != "" {
		return strconv.Quote(in.Policy) + " (plan " + strconv.Quote(in.Plan) + ")"
	}
	return strconv.Quote(in.Policy)
}

// violated names the rules marked Violated, or the reported one when none is.
func violated(rules []Info, reported *Info) []string {
	var names []string
	for i := range rules {
		if rules[i].Violated {
			names = append(names, rules[i].Policy)
		}
	}
	if names == nil {
		names = []string{reported.Policy}
	}
	return names
}
