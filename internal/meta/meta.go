// Package meta writes the budget metadata and the refusals of package middleware: the
// fields and bodies that package headers documents for users, in the headers.Style a
// middleware is configured with. Its functions keep no state; a [Values] holds the memory
// of header values that many responses share.
package meta

import (
	"net/http"
	"strconv"
	"time"
	"unsafe"

	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/problem"
)

// Canonical map keys of the fields in the table of the package documentation, so that
// writing needs no canonicalisation per request. (net/http canonicalises X-RateLimit-*
// to X-Ratelimit-*, which is the same header: field names are case-insensitive.)
var (
	keyLimit     = http.CanonicalHeaderKey("X-RateLimit-Limit")
	keyRemaining = http.CanonicalHeaderKey("X-RateLimit-Remaining")
	keyReset     = http.CanonicalHeaderKey("X-RateLimit-Reset")
	keyPolicy    = http.CanonicalHeaderKey("RateLimit-Policy")
	keyRateLimit = http.CanonicalHeaderKey("RateLimit")
)

// keyRetryAfter is the canonical map key of Retry-After.
const keyRetryAfter = "Retry-After"

// x, ietf and draft10 tell which fields style s writes.
func x(s headers.Style) bool { return s == headers.XRateLimit }

func ietf(s headers.Style) bool { return s == headers.IETF || s == headers.IETFDraft10 }

func draft10(s headers.Style) bool { return s == headers.IETFDraft10 }

// Quota units of the qu parameter (the initial entries of the drafts' registry).
const (
	UnitRequests           = "requests"
	UnitContentBytes       = "content-bytes"
	UnitConcurrentRequests = "concurrent-requests"
)

// Info is the budget metadata of one response, for one rule.
type Info struct {
	// Policy is the rule's name.
	Policy string
	// Plan is the name of the plan the rule decided the request under, "" for none:
	// RateLimit-Policy's parameter ratebudget-plan, and the refusal body's plan when the
	// rule is the reported one.
	Plan string
	// Limit is the rule's capacity, in cost units.
	Limit int64
	// Remaining is the cost units left after this request; negative values are sent as 0.
	Remaining int64
	// Reset is the time until the budget is whole again, sent as X-RateLimit-Reset in
	// whole seconds, rounded up (0 when zero or negative).
	Reset time.Duration
	// Window is the rule's window or refill period, sent as RateLimit-Policy's w in whole
	// seconds, rounded up and at least 1; zero or negative omits w.
	Window time.Duration
	// RetryAfter is, for a refusal, the earliest time a retry could be admitted, sent as
	// Retry-After in whole seconds, rounded up and at least 1. Write ignores it.
	RetryAfter time.Duration
	// Available is the time until more quota is made available (the end of a fixed
	// window, the next token of a token bucket): draft-11's effective window, within
	// which the client can use no more than Remaining, sent rounded down; draft-10's t,
	// sent rounded up. Zero or negative means unknown, and t is omitted (it is optional
	// in both drafts).
	Available time.Duration
	// Unit is the quota unit (qu): "" or [UnitRequests] (the default, not sent),
	// [UnitContentBytes] or [UnitConcurrentRequests].
	Unit string
	// Cost is the cost of the request in this rule's units (zero: unknown). Refusal
	// bodies use it to say that a cost does not fit what remains.
	Cost int64
	// Violated is true when this rule refused the request; refusals list such rules in
	// the problem's violated-policies.
	Violated bool
	// Unreported is true when the rule's state is not known (the limiter reported
	// another rule only): RateLimit-Policy lists the rule, RateLimit does not.
	Unreported bool
	// LimitText, when not empty, is Limit in decimal, formatted once by a caller that
	// keeps one per rule; Write copies it instead of formatting Limit. It is ignored
	// when longer than 20 bytes.
	LimitText string
}

// maxSFInteger is the largest RFC 9651 sf-integer (15 digits). A larger value would make
// the whole field invalid, so the IETF fields send this one instead.
const maxSFInteger = 999_999_999_999_999

// appendSFInteger appends n, clamped to 0..maxSFInteger, as an sf-integer.
func appendSFInteger(b []byte, n int64) []byte {
	return strconv.AppendInt(b, min(max(n, 0), maxSFInteger), 10)
}

// Write sets the metadata headers of style s on h for a request decided under rules,
// replacing earlier values: X-RateLimit-* describe rules[reported] (the refusing rule,
// or when admitted the most restrictive one); RateLimit-Policy and RateLimit list every
// rule as its own list member, in order (a rule marked Unreported only in
// RateLimit-Policy). A request under one rule passes a one-element slice and 0. An
// out-of-range reported index writes no X-RateLimit-* fields; style headers.None, an unknown
// style or no rules write nothing. Write keeps no reference to rules.
func Write(h http.Header, s headers.Style, rules []Info, reported int) {
	(*Values)(nil).Write(h, s, rules, reported)
}

// Write is the package's [Write], with the values' memory from v; a nil v allocates it
// for this response.
func (v *Values) Write(h http.Header, s headers.Style, rules []Info, reported int) {
	if !x(s) && !ietf(s) || len(rules) == 0 {
		return
	}
	if len(rules) == 1 && reported == 0 && !rules[0].Unreported {
		writeOne(h, s, &rules[0], v)
		return
	}
	if x(s) && reported >= 0 && reported < len(rules) {
		writeX(h, &rules[reported], v)
	}
	if ietf(s) {
		// Room for four rules of names up to maxPolicyNameLen without an allocation
		// (the middleware's stacks keep up to four checks inline too).
		var buf [4 * (2*maxPolicyNameLen + 96)]byte
		b := buf[:0]
		for i := range rules {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendPolicy(b, &rules[i])
		}
		j := len(b)
		first := true
		for i := range rules {
			if rules[i].Unreported {
				continue
			}
			if !first {
				b = append(b, ", "...)
			}
			first = false
			b = appendRateLimit(b, &rules[i], draft10(s))
		}
		all, vals := v.values(b, 2)
		vals[0], vals[1] = all[:j], all[j:]
		h[keyPolicy] = vals[0:1:1]
		if first {
			delete(h, keyRateLimit)
		} else {
			h[keyRateLimit] = vals[1:2:2]
		}
	}
}

// writeOne is Write for a single reported rule, with fewer allocations.
func writeOne(h http.Header, s headers.Style, in *Info, v *Values) {
	if x(s) {
		writeX(h, in, v)
	}
	if ietf(s) {
		var buf [3*maxPolicyNameLen + 160]byte
		b := appendPolicy(buf[:0], in)
		i := len(b)
		b = appendRateLimit(b, in, draft10(s))
		all, vals := v.values(b, 2)
		vals[0], vals[1] = all[:i], all[i:]
		h[keyPolicy] = vals[0:1:1]
		h[keyRateLimit] = vals[1:2:2]
	}
}

// writeX sets the X-RateLimit-* fields: with the memory of v, or in one allocation when
// v is nil (the values and the slices h holds share it).
func writeX(h http.Header, in *Info, v *Values) {
	var buf [60]byte // three int64 in decimal: at most 3 × 20 bytes
	var b []byte
	if in.LimitText != "" && len(in.LimitText) <= 20 {
		b = append(buf[:0], in.LimitText...)
	} else {
		b = strconv.AppendInt(buf[:0], in.Limit, 10)
	}
	i := len(b)
	b = strconv.AppendInt(b, max(in.Remaining, 0), 10)
	j := len(b)
	b = strconv.AppendInt(b, problem.Seconds(in.Reset), 10)
	var all string
	var vals []string
	if v == nil {
		x := new(values3)
		n := copy(x.buf[:], b)
		all, vals = unsafe.String(&x.buf[0], n), x.vals[:]
	} else {
		all, vals = v.values(b, 3)
	}
	vals[0], vals[1], vals[2] = all[:i], all[i:j], all[j:]
	h[keyLimit] = vals[0:1:1]
	h[keyRemaining] = vals[1:2:2]
	h[keyReset] = vals[2:3:3]
}

// maxPolicyNameLen is the policy-name length up to which Write formats the IETF fields
// of one rule without an extra allocation (longer names still work).
const maxPolicyNameLen = 64

// values3 holds three header values and their bytes in one allocation. Its strings point
// into buf, which is never written after they are made.
type values3 struct {
	vals [3]string
	buf  [60]byte // three int64 in decimal: at most 3 × 20 bytes
}

// Values is the memory of header values, handed out from chunks that many responses
// share, so that writing a response's fields does not allocate each time: a chunk
// serves about 40 responses' fields (85 of X-RateLimit fields alone). Memory handed out
// is never written again, and the slices a header holds have a capacity of one, so that
// an append copies; a chunk is freed once no value made from it is referenced (a value a
// handler keeps keeps its chunk, 8 KiB, alive). The zero Values is ready to use. A
// Values is not safe for concurrent use: the middleware keeps one in each of its pooled
// request states.
type Values struct {
	buf  []byte   // the current chunk's bytes: those past len, up to cap, are free
	vals []string // the current chunk's free value slots
}

// chunk is the memory that a Values hands out, allocated at once.
type chunk struct {
	buf  [4096]byte
	vals [256]string
}

// values returns b copied into v's memory as a string, and n value slots: both from
// one chunk, so that a chunk's slots never refer to another chunk (a chain of chunks
// would keep every older one alive). A nil v, and a request larger than a chunk,
// allocate them.
func (v *Values) values(b []byte, n int) (string, []string) {
	if v == nil || len(b) > len(chunk{}.buf) || n > len(chunk{}.vals) {
		return string(b), make([]string, n)
	}
	if cap(v.buf)-len(v.buf) < len(b) || len(v.vals) < n {
		v.grow()
	}
	var str string
	if len(b) > 0 {
		i := len(v.buf)
		v.buf = append(v.buf, b...)
		str = unsafe.String(&v.buf[i], len(b))
	}
	slots := v.vals[:n:n]
	v.vals = v.vals[n:]
	return str, slots
}

// grow makes a new chunk v's memory. The old one stays with the values made from it.
func (v *Values) grow() {
	c := new(chunk)
	v.buf, v.vals = c.buf[:0], c.vals[:]
}

func appendPolicy(b []byte, in *Info) []byte {
	b = appendSFString(b, in.Policy)
	b = append(b, ";q="...)
	b = appendSFInteger(b, in.Limit)
	if in.Unit != "" && in.Unit != UnitRequests && validUnit(in.Unit) {
		b = append(b, ";qu="...)
		b = appendSFString(b, in.Unit)
	}
	if in.Window > 0 {
		b = append(b, ";w="...)
		b = appendSFInteger(b, max(problem.Seconds(in.Window), 1))
	}
	if in.Plan != "" {
		b = append(b, ";"+PlanParam+"="...)
		b = appendSFString(b, in.Plan)
	}
	return b
}

// PlanParam is the RateLimit-Policy parameter that names a rule's plan (an extension
// parameter: the drafts let a receiver ignore parameters it does not know).
const PlanParam = "ratebudget-plan"

func appendRateLimit(b []byte, in *Info, draft10 bool) []byte {
	b = appendSFString(b, in.Policy)
	b = append(b, ";r="...)
	b = appendSFInteger(b, in.Remaining)
	switch {
	case in.Available <= 0:
	case draft10:
		// Rounded up: more quota is available once t seconds have passed.
		b = append(b, ";t="...)
		b = appendSFInteger(b, problem.Seconds(in.Available))
	default:
		// Rounded down: within the rounded-up value the client could use more.
		b = append(b, ";t="...)
		b = appendSFInteger(b, int64(in.Available/time.Second))
	}
	return b
}

// validUnit reports whether u can be sent as an sf-string token of the unit registry:
// lowercase letters and '-'.
func validUnit(u string) bool {
	for i := 0; i < len(u); i++ {
		if c := u[i]; !(c >= 'a' && c <= 'z' || c == '-') {
			return false
		}
	}
	return u != ""
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
