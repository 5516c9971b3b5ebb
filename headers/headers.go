// Package headers writes a limiter's answer into HTTP responses: budget metadata on
// limited responses, and the refusals (429 Too Many Requests, 413 for a cost that can
// never be admitted, 503 Service Unavailable when the budget store is down).
//
// It depends on the standard library only, so custom refusal handlers can reuse it.
//
// # Metadata headers
//
// Every value describes one budget: the rule reported by the decision (the refusing rule,
// or when admitted the most restrictive one), for the identity and scope of this request.
//
//	header                  unit                         meaning
//	X-RateLimit-Limit       cost units                   the rule's capacity (Limit, or Burst for a token bucket)
//	X-RateLimit-Remaining   cost units                   units left after this request (a snapshot, not a reservation)
//	X-RateLimit-Reset       seconds, rounded up          time until the budget is whole again if nothing more is spent
//	RateLimit-Policy        structured field (draft-10)  "<rule>";q=<capacity>;w=<window seconds>
//	RateLimit               structured field (draft-10)  "<rule>";r=<remaining>;t=<reset seconds>
//	Retry-After             seconds, rounded up, >= 1    refusals only: earliest useful retry (RFC 9110 §10.2.3)
//
// The X-RateLimit-* names are a convention, not a standard; RateLimit-Policy and RateLimit
// follow draft-ietf-httpapi-ratelimit-headers-10, still an Internet-Draft. [Style] picks
// which set is sent.
package headers

import (
	"net/http"
	"strconv"
	"time"
	"unsafe"
)

// Header names, as sent. (net/http canonicalises X-RateLimit-* to X-Ratelimit-*, which is
// the same header: field names are case-insensitive.)
const (
	Limit      = "X-RateLimit-Limit"
	Remaining  = "X-RateLimit-Remaining"
	Reset      = "X-RateLimit-Reset"
	Policy     = "RateLimit-Policy"
	RateLimit  = "RateLimit"
	RetryAfter = "Retry-After"
)

// Canonical map keys, so that writing needs no canonicalisation per request.
var (
	keyLimit     = http.CanonicalHeaderKey(Limit)
	keyRemaining = http.CanonicalHeaderKey(Remaining)
	keyReset     = http.CanonicalHeaderKey(Reset)
	keyPolicy    = http.CanonicalHeaderKey(Policy)
	keyRateLimit = http.CanonicalHeaderKey(RateLimit)
)

// Style selects which budget metadata headers are written.
type Style uint8

const (
	// XRateLimit writes X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset.
	// It is the zero value.
	XRateLimit Style = iota
	// IETF writes RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers-10).
	IETF
	// Both writes both sets.
	Both
	// None writes no metadata (e.g. for authentication endpoints, where remaining attempts
	// help an attacker). Refusals still carry Retry-After.
	None
)

// String returns "x", "ietf", "both" or "none".
func (s Style) String() string {
	switch s {
	case XRateLimit:
		return "x"
	case IETF:
		return "ietf"
	case Both:
		return "both"
	case None:
		return "none"
	}
	return "Style(" + strconv.Itoa(int(s)) + ")"
}

// ParseStyle maps "x", "ietf", "both" and "none" to a Style.
func ParseStyle(s string) (Style, bool) {
	switch s {
	case "x":
		return XRateLimit, true
	case "ietf":
		return IETF, true
	case "both":
		return Both, true
	case "none":
		return None, true
	}
	return 0, false
}

// Info is the budget metadata of one response, for one rule.
type Info struct {
	// Policy is the rule's name.
	Policy string
	// Limit is the rule's capacity, in cost units.
	Limit int64
	// Remaining is the cost units left after this request; negative values are sent as 0.
	Remaining int64
	// Reset is the time until the budget is whole again.
	Reset time.Duration
	// Window is the rule's window or refill period.
	Window time.Duration
	// RetryAfter is, for a refusal, the earliest time a retry could be admitted.
	RetryAfter time.Duration
	// LimitText, when not empty, is Limit in decimal, formatted once by a caller that
	// keeps one per rule; Write copies it instead of formatting Limit.
	LimitText string
}

// Seconds converts d to whole seconds, rounded up; zero and negative durations give 0.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// RetryAfterSeconds is the Retry-After value for d: whole seconds, rounded up, at least 1.
// Rounding down would invite a retry that is certain to be refused.
func RetryAfterSeconds(d time.Duration) int64 {
	return max(Seconds(d), 1)
}

// Write sets the metadata headers of style s on h from in, replacing earlier values.
// It makes one allocation per style: the values and the slices h holds share it.
func Write(h http.Header, s Style, in Info) {
	if s == None {
		return
	}
	rem := max(in.Remaining, 0)
	if s == XRateLimit || s == Both {
		v := new(values3)
		var b []byte
		if in.LimitText != "" && len(in.LimitText) <= 20 {
			b = append(v.buf[:0], in.LimitText...)
		} else {
			b = strconv.AppendInt(v.buf[:0], in.Limit, 10)
		}
		i := len(b)
		b = strconv.AppendInt(b, rem, 10)
		j := len(b)
		b = strconv.AppendInt(b, Seconds(in.Reset), 10)
		v.vals[0], v.vals[1], v.vals[2] = v.str(b, 0, i), v.str(b, i, j), v.str(b, j, len(b))
		h[keyLimit] = v.vals[0:1:1]
		h[keyRemaining] = v.vals[1:2:2]
		h[keyReset] = v.vals[2:3:3]
	}
	if s == IETF || s == Both {
		var buf [2*MaxPolicyNameLen + 96]byte
		b := appendPolicy(buf[:0], in.Policy, in.Limit, in.Window)
		i := len(b)
		b = appendRateLimit(b, in.Policy, rem, in.Reset)
		all := string(b)
		vals := make([]string, 2)
		vals[0], vals[1] = all[:i], all[i:]
		h[keyPolicy] = vals[0:1:1]
		h[keyRateLimit] = vals[1:2:2]
	}
}

// MaxPolicyNameLen is the policy-name length up to which Write formats the IETF fields
// without an extra allocation (longer names still work).
const MaxPolicyNameLen = 64

// values3 holds three header values and their bytes in one allocation. Its strings point
// into buf, which is never written after they are made.
type values3 struct {
	vals [3]string
	buf  [60]byte // three int64 in decimal: at most 3 × 20 bytes
}

// str returns b[i:j] as a string sharing b's memory, which must be v.buf's.
func (v *values3) str(b []byte, i, j int) string {
	if i == j {
		return ""
	}
	return unsafe.String(&b[i], j-i)
}

// PolicyValue formats a RateLimit-Policy item: "<name>";q=<quota>;w=<window seconds>.
func PolicyValue(name string, quota int64, window time.Duration) string {
	return string(appendPolicy(nil, name, quota, window))
}

// RateLimitValue formats a RateLimit item: "<name>";r=<remaining>;t=<reset seconds>.
func RateLimitValue(name string, remaining int64, reset time.Duration) string {
	return string(appendRateLimit(nil, name, remaining, reset))
}

func appendPolicy(b []byte, name string, quota int64, window time.Duration) []byte {
	b = appendSFString(b, name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, quota, 10)
	b = append(b, ";w="...)
	return strconv.AppendInt(b, Seconds(window), 10)
}

func appendRateLimit(b []byte, name string, remaining int64, reset time.Duration) []byte {
	b = appendSFString(b, name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, max(remaining, 0), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, Seconds(reset), 10)
}

// appendSFString appends s quoted as an RFC 9651 sf-string, dropping bytes it cannot
// carry.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20 && c < 0x7f:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
