package keyfuncs

import (
	"net/http"
	"net/netip"
	"strings"

	"github.com/ratebudget/ratebudget/internal/keyreason"
)

// maxForwardedHops bounds the number of RFC 7239 elements read from one request. Real
// chains are a few hops long; a longer one is refused rather than parsed at length.
const maxForwardedHops = 64

// hop is one "for" value of a Forwarded element.
type hop struct {
	addr  netip.Addr // valid for an address
	raw   string     // the address text, when it is a bare address (lets keys reuse it)
	known bool       // false for "unknown", an obfuscated identifier or a missing "for"
}

func (c *ipConfig) fromForwarded(r *http.Request) (string, error) {
	p, k, trusted, err := c.trustedPeer(r)
	if err != nil || !trusted {
		return k, err
	}
	var buf [8]hop
	hops, ok := parseForwarded(r.Header["Forwarded"], buf[:0])
	if !ok {
		return "", c.errHeader
	}
	if len(hops) == 0 {
		if c.strict {
			return "", keyreason.ErrNoClientIP
		}
		return c.key(p, k), nil
	}
	for i := len(hops) - 1; i >= 0; i-- {
		h := hops[i]
		if !h.known {
			return "", keyreason.ErrNoClientIP
		}
		if !c.trustedAddr(h.addr) {
			return c.key(h.addr, h.raw), nil
		}
	}
	return c.key(hops[0].addr, hops[0].raw), nil
}

// Parameters that RFC 7239 section 5 registers; each may occur once per element.
const (
	paramFor = 1 << iota
	paramBy
	paramHost
	paramProto
)

// parseForwarded parses the Forwarded header lines with the grammar of RFC 7239 section
// 4 and appends one hop per non-empty element, in order:
//
//	Forwarded         = 1#forwarded-element
//	forwarded-element = [ forwarded-pair ] *( ";" [ forwarded-pair ] )
//	forwarded-pair    = token "=" value
//	value             = token / quoted-string
//
// Spaces and tabs may surround ',' (an HTTP list) and ';' (which changes no value: no
// token holds one). Lines are one list, in order, each parsed on its own. It reports
// false for any other syntax, anywhere in the header: an unquoted value that is not a
// token (an IPv6 address, a port), whitespace around '=', an unterminated quoted
// string, a control character; for a "for", "by", "host" or "proto" parameter given
// twice in an element; for a "for" value that is not a node (see parseForValue); and for
// more than maxForwardedHops elements.
func parseForwarded(lines []string, hops []hop) ([]hop, bool) {
	for _, s := range lines {
		i := 0
		for {
			h, j, empty, ok := parseElement(s, i)
			if !ok {
				return hops, false
			}
			if !empty {
				if len(hops) == maxForwardedHops {
					return hops, false
				}
				hops = append(hops, h) // an element without "for" stays an unknown hop
			}
			if j >= len(s) {
				break
			}
			i = j + 1 // skip ','
		}
	}
	return hops, true
}

// parseElement parses the forwarded-element of s at i, with the whitespace before it:
// pairs separated by ';', ended by ',' or the end of the line. It returns the element's
// hop (an unknown hop without "for"), the index of its ',' (or len(s)), and whether it
// has no pair; ok is false for a syntax error, a parameter given twice or a "for" value
// that is not a node.
func parseElement(s string, i int) (h hop, end int, empty, ok bool) {
	i = skipOWS(s, i)
	seen := 0
	empty = true
	for i < len(s) && s[i] != ',' {
		if s[i] == ';' {
			i = skipOWS(s, i+1)
			continue
		}
		var name, val string
		if name, val, i, ok = parsePair(s, i); !ok {
			return h, i, empty, false
		}
		empty = false
		p := param(name)
		if seen&p != 0 {
			return h, i, empty, false
		}
		seen |= p
		if p == paramFor {
			if h, ok = parseForValue(val); !ok {
				return h, i, empty, false
			}
		}
		i = skipOWS(s, i)
		if i < len(s) && s[i] != ';' && s[i] != ',' {
			return h, i, empty, false
		}
	}
	return h, i, empty, true
}

// parsePair parses the forwarded-pair of s at i, token "=" value, the value a token or
// a quoted string (returned unquoted). It returns the index after the pair; ok is false
// for any other syntax.
func parsePair(s string, i int) (name, val string, end int, ok bool) {
	j := tokenEnd(s, i)
	if j == i || j >= len(s) || s[j] != '=' {
		return "", "", i, false
	}
	name, i = s[i:j], j+1
	if i < len(s) && s[i] == '"' {
		val, i, ok = quoted(s, i)
		return name, val, i, ok
	}
	if j = tokenEnd(s, i); j == i {
		return "", "", i, false
	}
	return name, s[i:j], j, true
}

// param returns the bit of a registered parameter name (case-insensitive), or 0 for an
// extension.
func param(name string) int {
	switch {
	case strings.EqualFold(name, "for"):
		return paramFor
	case strings.EqualFold(name, "by"):
		return paramBy
	case strings.EqualFold(name, "host"):
		return paramHost
	case strings.EqualFold(name, "proto"):
		return paramProto
	}
	return 0
}

// parseForValue parses a node (RFC 7239 section 6), nodename [ ":" node-port ], where
// nodename is an IPv4 address, a bracketed IPv6 address (without a zone), "unknown" or an
// obfuscated identifier "_x", and node-port is 1 to 5 digits or an obfuscated port. An
// "unknown" or obfuscated node, with or without a port, is an unknown hop.
func parseForValue(v string) (hop, bool) {
	if v != "" && v[0] == '[' {
		j := strings.IndexByte(v, ']')
		if j < 0 || !validPort(v[j+1:]) || strings.IndexByte(v[1:j], '%') >= 0 {
			return hop{}, false
		}
		a, err := netip.ParseAddr(v[1:j])
		if err != nil || !a.Is6() {
			return hop{}, false
		}
		return hop{addr: normalize(a), known: true}, true
	}
	host, port := v, ""
	if j := strings.IndexByte(v, ':'); j >= 0 {
		host, port = v[:j], v[j:]
	}
	if !validPort(port) {
		return hop{}, false
	}
	if strings.EqualFold(host, "unknown") {
		return hop{}, true
	}
	if host != "" && host[0] == '_' {
		return hop{}, obfuscated(host[1:])
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !a.Is4() {
		return hop{}, false
	}
	return hop{addr: a, raw: host, known: true}, true
}

// validPort accepts "", ":" followed by 1 to 5 digits, or ":" followed by an obfuscated
// port ("_x").
func validPort(p string) bool {
	if p == "" {
		return true
	}
	if p[0] != ':' || len(p) == 1 {
		return false
	}
	p = p[1:]
	if p[0] == '_' {
		return obfuscated(p[1:])
	}
	if len(p) > 5 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}

// obfuscated reports whether s (after the leading '_') is 1*(ALPHA / DIGIT / "." / "_" /
// "-").
func obfuscated(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// quoted reads the quoted-string starting at s[i] == '"' (RFC 9110 section 5.6.4): qdtext
// is HTAB, SP and any byte but '"', '\', other controls and DEL; a quoted-pair is '\'
// followed by HTAB, SP or a byte that is not a control or DEL. It returns the unescaped
// value and the index after the closing quote.
func quoted(s string, i int) (string, int, bool) {
	i++
	start := i
	escaped := false
	for ; i < len(s); i++ {
		c := s[i]
		if c == '\\' {
			escaped = true
			if i++; i == len(s) {
				break
			}
			c = s[i]
		} else if c == '"' {
			v := s[start:i]
			if escaped {
				v = unescape(v)
			}
			return v, i + 1, true
		}
		if c < 0x20 && c != '\t' || c == 0x7f {
			return "", i, false
		}
	}
	return "", i, false
}

func unescape(v string) string {
	var b strings.Builder
	b.Grow(len(v))
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// tokenEnd returns the index after the run of token characters starting at s[i].
func tokenEnd(s string, i int) int {
	for i < len(s) && isTchar(s[i]) {
		i++
	}
	return i
}

// isTchar reports whether c is an RFC 9110 token character.
func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
