package meta_test

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/meta"
)

// sfItem is one member of a structured-field List: a bare item and its parameters, each
// held as its type ('s' string, 'i' integer, 'b' byte sequence, 't' token, '?' boolean)
// and its decoded text.
type sfItem struct {
	kind   byte
	value  string
	params map[string]sfBare
	order  []string
}

type sfBare struct {
	kind  byte
	value string
}

// parseSFList is a strict RFC 9651 §4.2 parser of a List of Items (no inner lists,
// decimals, dates or display strings, which the fields never use): what a strict
// recipient does with the field, which it discards whole on any error.
func parseSFList(s string) ([]sfItem, bool) {
	i := 0
	for i < len(s) && s[i] == ' ' {
		i++
	}
	var items []sfItem
	for i < len(s) {
		var it sfItem
		var b sfBare
		var ok bool
		if b, i, ok = parseSFBare(s, i); !ok {
			return nil, false
		}
		it.kind, it.value, it.params = b.kind, b.value, map[string]sfBare{}
		for i < len(s) && s[i] == ';' {
			i++
			for i < len(s) && s[i] == ' ' {
				i++
			}
			j := i
			if j >= len(s) || !(s[j] >= 'a' && s[j] <= 'z' || s[j] == '*') {
				return nil, false
			}
			for j < len(s) && (s[j] >= 'a' && s[j] <= 'z' || s[j] >= '0' && s[j] <= '9' || strings.IndexByte("_-.*", s[j]) >= 0) {
				j++
			}
			key := s[i:j]
			i = j
			v := sfBare{kind: '?', value: "1"}
			if i < len(s) && s[i] == '=' {
				if v, i, ok = parseSFBare(s, i+1); !ok {
					return nil, false
				}
			}
			if _, dup := it.params[key]; !dup {
				it.order = append(it.order, key)
			}
			it.params[key] = v
		}
		items = append(items, it)
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i == len(s) {
			return items, true
		}
		if s[i] != ',' {
			return nil, false
		}
		i++
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i == len(s) {
			return nil, false // a trailing comma
		}
	}
	return nil, false // empty
}

func parseSFBare(s string, i int) (sfBare, int, bool) {
	if i >= len(s) {
		return sfBare{}, i, false
	}
	switch c := s[i]; {
	case c == '-' || c >= '0' && c <= '9':
		j := i
		if c == '-' {
			j++
		}
		k := j
		for k < len(s) && s[k] >= '0' && s[k] <= '9' {
			k++
		}
		if k == j || k-j > 15 || k < len(s) && s[k] == '.' {
			return sfBare{}, i, false
		}
		return sfBare{'i', s[i:k]}, k, true
	case c == '"':
		var b strings.Builder
		for j := i + 1; j < len(s); j++ {
			switch d := s[j]; {
			case d == '\\':
				if j+1 >= len(s) || s[j+1] != '"' && s[j+1] != '\\' {
					return sfBare{}, i, false
				}
				j++
				b.WriteByte(s[j])
			case d == '"':
				return sfBare{'s', b.String()}, j + 1, true
			case d < 0x20 || d > 0x7e:
				return sfBare{}, i, false
			default:
				b.WriteByte(d)
			}
		}
		return sfBare{}, i, false
	case c == ':':
		j := strings.IndexByte(s[i+1:], ':')
		if j < 0 {
			return sfBare{}, i, false
		}
		raw, err := base64.StdEncoding.Strict().DecodeString(s[i+1 : i+1+j])
		if err != nil {
			return sfBare{}, i, false
		}
		return sfBare{'b', string(raw)}, i + j + 2, true
	case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '*':
		j := i + 1
		for j < len(s) && (s[j] > 0x20 && s[j] < 0x7f && strings.IndexByte(`"(),;<=>?@[\]{}`, s[j]) < 0 || s[j] == ':' || s[j] == '/') {
			j++
		}
		return sfBare{'t', s[i:j]}, j, true
	}
	return sfBare{}, i, false
}

// sendable is the policy name as an sf-string can carry it: printable ASCII only.
func sendable(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x20 && s[i] < 0x7f {
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

func nonNegInt(b sfBare, min int64) bool {
	n, err := strconv.ParseInt(b.value, 10, 64)
	return b.kind == 'i' && err == nil && n >= min
}

// Whatever the Info, every style writes fields a strict recipient accepts: field values
// without control bytes, X-RateLimit-* as 1*DIGIT, Retry-After as delay-seconds, and the
// IETF fields as structured-field Lists of Strings whose parameters have the types the
// drafts give them (q, r, t non-negative Integers, w a positive one, qu a String).
func FuzzStructuredFields(f *testing.F) {
	f.Add("api", int64(100), int64(42), int64(30e9), int64(60e9), int64(1e9), int64(1e9), "content-bytes", uint8(2), int64(3))
	f.Add("a\"b\\c\x01\xff", int64(-1), int64(1e16), int64(-5), int64(1), int64(0), int64(-1), "Bytes", uint8(5), int64(0))
	f.Add("", int64(1<<62), int64(-1<<62), int64(1<<62), int64(1<<62), int64(1<<62), int64(1<<62), "", uint8(4), int64(1<<62))
	f.Fuzz(func(t *testing.T, policy string, limit, remaining, reset, window, available, retry int64, unit string, style uint8, cost int64) {
		s := []headers.Style{"", headers.XRateLimit, headers.IETF, headers.None, headers.IETFDraft10, "both"}[style%6]
		in := meta.Info{
			Policy: policy, Limit: limit, Remaining: remaining, Reset: time.Duration(reset), Window: time.Duration(window),
			RetryAfter: time.Duration(retry), Available: time.Duration(available), Unit: unit, Cost: cost, Violated: true,
		}
		other := meta.Info{Policy: "other", Limit: 5, Remaining: 5}
		for _, rules := range [][]meta.Info{{in}, {other, in}} {
			h := http.Header{}
			meta.Write(h, s, rules, len(rules)-1)
			rec := newRecorder()
			meta.WriteTooManyRequests(rec, req(), s, rules, len(rules)-1)
			for _, hh := range []http.Header{h, rec.Header()} {
				checkFields(t, hh, s, rules)
			}
			if v := rec.Header().Get("Retry-After"); !isDigits(v) || v == "0" {
				t.Fatalf("Retry-After %q", v)
			}
		}
	})
}

func checkFields(t *testing.T, h http.Header, s headers.Style, rules []meta.Info) {
	t.Helper()
	for k, vs := range h {
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n\x00") {
				t.Fatalf("%s: %q holds a control byte", k, v)
			}
		}
	}
	for _, k := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		if v, ok := h[http.CanonicalHeaderKey(k)]; ok && (len(v) != 1 || !isDigits(strings.TrimPrefix(v[0], "-"))) {
			t.Fatalf("%s: %q", k, v)
		}
	}
	if s != headers.IETF && s != headers.IETFDraft10 {
		if h.Get("RateLimit") != "" || h.Get("RateLimit-Policy") != "" {
			t.Fatalf("style %v wrote the IETF fields: %v", s, h)
		}
		return
	}
	policy, ok := parseSFList(h.Get("RateLimit-Policy"))
	if !ok || len(policy) != len(rules) {
		t.Fatalf("RateLimit-Policy %q: not a List of %d items", h.Get("RateLimit-Policy"), len(rules))
	}
	limit, ok := parseSFList(h.Get("RateLimit"))
	if !ok || len(limit) != len(rules) {
		t.Fatalf("RateLimit %q: not a List of %d items", h.Get("RateLimit"), len(rules))
	}
	for i := range rules {
		p, l, in := policy[i], limit[i], &rules[i]
		if p.kind != 's' || l.kind != 's' || p.value != sendable(in.Policy) || l.value != p.value {
			t.Fatalf("item %d: %+v %+v, want the String %q", i, p, l, sendable(in.Policy))
		}
		for _, it := range []sfItem{p, l} {
			if b, ok := it.params["pk"]; ok {
				t.Fatalf("item %d: pk %+v, but no partition key is sent", i, b)
			}
		}
		if q, ok := p.params["q"]; !ok || !nonNegInt(q, 0) {
			t.Fatalf("item %d: q %+v", i, q)
		}
		if w, ok := p.params["w"]; ok && !nonNegInt(w, 1) {
			t.Fatalf("item %d: w %+v", i, w)
		}
		if qu, ok := p.params["qu"]; ok && qu.kind != 's' {
			t.Fatalf("item %d: qu %+v", i, qu)
		}
		if r, ok := l.params["r"]; !ok || !nonNegInt(r, 0) {
			t.Fatalf("item %d: r %+v", i, r)
		}
		if tt, ok := l.params["t"]; ok && !nonNegInt(tt, 0) {
			t.Fatalf("item %d: t %+v", i, tt)
		}
	}
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

func req() *http.Request { return httptest.NewRequest("GET", "/", nil) }
