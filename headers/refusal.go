package headers

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
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

// Problem is an RFC 9457 problem details object, with the extension members this package
// uses.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Policy is the exhausted rule's name.
	Policy string `json:"policy,omitempty"`
	// RetryAfter is the Retry-After value, in seconds.
	RetryAfter int64 `json:"retry_after,omitempty"`
	// Cost and Capacity describe a cost that can never be admitted.
	Cost     int64 `json:"cost,omitempty"`
	Capacity int64 `json:"capacity,omitempty"`
}

// AcceptsJSON reports whether the request's Accept header names a JSON media type
// (application/json, application/problem+json or any +json suffix).
func AcceptsJSON(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(v, "json") {
			return true
		}
	}
	return false
}

// WriteProblem writes p with status p.Status: as application/problem+json when the client
// accepts JSON, as short text/plain otherwise. It sets Cache-Control: no-store, because
// refusals describe one moment and must not be cached (RFC 6585 §4). Headers already set
// on w (Retry-After, metadata) are kept. Nothing is written for HEAD beyond the headers.
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
// §4): Retry-After in whole seconds (rounded up, at least 1), Cache-Control: no-store,
// the metadata of style s, and a body naming the exhausted policy and the wait.
func WriteTooManyRequests(w http.ResponseWriter, r *http.Request, s Style, in Info) {
	Write(w.Header(), s, in)
	secs := RetryAfterSeconds(in.RetryAfter)
	w.Header().Set(RetryAfter, strconv.FormatInt(secs, 10))
	WriteProblem(w, r, Problem{
		Type:       ProblemQuotaExceeded,
		Title:      "Too Many Requests",
		Status:     http.StatusTooManyRequests,
		Detail:     "rate limit " + strconv.Quote(in.Policy) + " exhausted; retry in " + strconv.FormatInt(secs, 10) + "s",
		Policy:     in.Policy,
		RetryAfter: secs,
	})
}

// WriteCostExceeded writes the refusal for a request whose cost exceeds the capacity of a
// rule: it can never be admitted, so it is answered 413 Content Too Large without
// Retry-After (a 429 would invite pointless retries).
func WriteCostExceeded(w http.ResponseWriter, r *http.Request, s Style, in Info, cost int64) {
	Write(w.Header(), s, in)
	WriteProblem(w, r, Problem{
		Type:     ProblemCostExceedsLimit,
		Title:    "Request Cost Exceeds Capacity",
		Status:   http.StatusRequestEntityTooLarge,
		Detail:   "cost " + strconv.FormatInt(cost, 10) + " exceeds the capacity " + strconv.FormatInt(in.Limit, 10) + " of rate limit " + strconv.Quote(in.Policy) + "; it can never be admitted",
		Policy:   in.Policy,
		Cost:     cost,
		Capacity: in.Limit,
	})
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
// scope or cost could not be determined (for example no usable client address). Such a
// request is never counted in a shared bucket.
func WriteUnidentified(w http.ResponseWriter, r *http.Request, detail string) {
	WriteProblem(w, r, Problem{
		Type:   ProblemInvalidRequest,
		Title:  "Bad Request",
		Status: http.StatusBadRequest,
		Detail: detail,
	})
}
