package keyfuncs

import (
	"net/http"
	"net/netip"
	"strings"
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
			return "", ErrNoClientIP
		}
		return c.key(p, k), nil
	}
	for i := len(hops) - 1; i >= 0; i-- {
		h := hops[i]
		if !h.known {
			return "", ErrNoClientIP
		}
		if !c.trustedAddr(h.addr) {
			return c.key(h.addr, h.raw), nil
		}
	}
	return c.key(hops[0].addr, hops[0].raw), nil
}

// parseForwarded parses the Forwarded header lines (RFC 7239 section 4) and appends one
// hop per non-empty element, in order. It reports false for invalid syntax, an element
// with two "for" parameters, a "for" value that is neither an address nor "unknown" nor
// an obfuscated identifier, or more than maxForwardedHops elements.
func parseForwarded(lines []string, hops []hop) ([]hop, bool) {
	for _, s := range lines {
		i := 0
		for {
			// One element: pairs separated by ';', ended by ',' or the end of the line.
			i = skipOWS(s, i)
			var h hop
			hasFor, empty := false, true
			for i < len(s) && s[i] != ',' {
				if s[i] == ';' {
					i = skipOWS(s, i+1)
					continue
				}
				j := i
				for j < len(s) && isTchar(s[j]) {
					j++
				}
				if j == i || j >= len(s) || s[j] != '=' {
					return hops, false
				}
				name := s[i:j]
				i = j + 1
				var val string
				var ok bool
				if i < len(s) && s[i] == '"' {
					val, i, ok = quoted(s, i)
					if !ok {
						return hops, false
					}
				} else {
					j = i
					for j < len(s) && s[j] != ';' && s[j] != ',' && s[j] != ' ' && s[j] != '\t' && s[j] != '"' {
						j++
					}
					if j == i {
						return hops, false
					}
					val, i = s[i:j], j
				}
				empty = false
				if strings.EqualFold(name, "for") {
					if hasFor {
						return hops, false
					}
					hasFor = true
					if h, ok = parseForValue(val); !ok {
						return hops, false
					}
				}
				i = skipOWS(s, i)
				if i < len(s) && s[i] != ';' && s[i] != ',' {
					return hops, false
				}
			}
			if !empty {
				if len(hops) == maxForwardedHops {
					return hops, false
				}
				hops = append(hops, h) // an element without "for" stays an unknown hop
			}
			if i >= len(s) {
				break
			}
			i++ // skip ','
		}
	}
	return hops, true
}

// parseForValue parses a node (RFC 7239 section 6): "unknown", an obfuscated identifier
// "_x", an IPv4 address, or a bracketed IPv6 address, each with an optional port.
func parseForValue(v string) (hop, bool) {
	if strings.EqualFold(v, "unknown") {
		return hop{}, true
	}
	if v != "" && v[0] == '_' {
		return hop{}, obfuscated(v[1:])
	}
	host, port := v, ""
	if v != "" && v[0] == '[' {
		j := strings.IndexByte(v, ']')
		if j < 0 {
			return hop{}, false
		}
		host, port = v[1:j], v[j+1:]
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() || !validPort(port) {
			return hop{}, false
		}
		return hop{addr: normalize(a), known: true}, true
	}
	if j := strings.IndexByte(v, ':'); j >= 0 {
		host, port = v[:j], v[j:]
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !a.Is4() || !validPort(port) {
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

// quoted reads the quoted-string starting at s[i] == '"'. It returns the unescaped value
// and the index after the closing quote.
func quoted(s string, i int) (string, int, bool) {
	i++
	start := i
	escaped := false
	for ; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			escaped = true
			i++
		case c == '"':
			v := s[start:i]
			if escaped {
				v = unescape(v)
			}
			return v, i + 1, true
		case c < 0x20 && c != '\t' || c == 0x7f:
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

// isTchar reports whether c is an RFC 9110 token character.
func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
