package keyfuncs

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/ratebudget/ratebudget/internal/keyreason"
)

// IPOption configures [ClientIP]. Options are validated by ClientIP, which names the
// option at fault.
type IPOption func(*ipConfig) error

// source is where ClientIP reads the client address.
type source uint8

const (
	srcRemoteAddr source = iota
	srcXFF
	srcForwarded
	srcHeader
	srcChi
)

// optionName names the option that chooses source s (reading header, for a forwarding
// header), for configuration errors.
func optionName(s source, header string) string {
	switch s {
	case srcChi:
		return "ChiClientIP"
	}
	return fmt.Sprintf("FromHeader(%q)", header)
}

type ipConfig struct {
	src       source
	srcSet    bool
	header    string // the forwarding header's canonical name
	trusted   []netip.Prefix
	trustSet  bool
	strict    bool
	v4Bits    int
	v6Bits    int
	errHeader error // keyreason.ErrInvalidHeader naming the header, built once
}

// ClientIP returns a key function whose key is the client's IP address, grouped by prefix:
// "203.0.113.7" for an IPv4 client (a /32, the default) and "2001:db8:1:2::/64" for an
// IPv6 client (a /64, the default; see [Prefixes]). Options choose where the address comes from and how
// addresses are grouped; they are checked once, here, and an invalid one makes ClientIP
// return an error naming it.
//
// Without options the address is the TCP peer (r.RemoteAddr, "host:port" or a bare IP):
// it cannot be spoofed, but behind a proxy it is the proxy's address. A middleware that
// rewrites r.RemoteAddr from request headers before ClientIP runs, such as chi's
// middleware.RealIP (which believes X-Forwarded-For and X-Real-IP from anyone), makes it
// whatever the client writes: do not mount one in front of a limit. Behind proxies,
// name them with [TrustedProxies] and choose the forwarding header they write with
// [FromHeader]; the header is then believed only when the TCP peer is itself a trusted
// proxy. To reuse the address that chi's
// middleware.ClientIPFrom* middlewares stored, use [ChiClientIP].
//
// IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) are read as IPv4, and IPv6 zones are
// dropped, before any trust check and before grouping.
//
// The key function fails when no address can be known (a unix-socket peer, an "unknown"
// or obfuscated hop in Forwarded), which the middleware answers with 400, "the client
// address could not be determined", and when a forwarding header that must be read is
// malformed: 400, "header X-Forwarded-For is malformed" (naming the header). It never
// falls back to a proxy's address after an error.
func ClientIP(opts ...IPOption) (func(*http.Request) (string, error), error) {
	c := &ipConfig{v4Bits: 32, v6Bits: 64}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("keyfuncs: ClientIP: nil option")
		}
		if err := o(c); err != nil {
			return nil, err
		}
	}
	forwarding := c.src == srcXFF || c.src == srcForwarded || c.src == srcHeader
	switch {
	case forwarding && !c.trustSet:
		return nil, fmt.Errorf("keyfuncs: %s requires TrustedProxies: forwarding headers are believed only from trusted peers", optionName(c.src, c.header))
	case c.trustSet && c.src == srcChi:
		return nil, errors.New("keyfuncs: TrustedProxies cannot be combined with ChiClientIP: the chi middleware makes the trust decision")
	case c.trustSet && !forwarding:
		return nil, errors.New("keyfuncs: TrustedProxies has no effect without FromHeader")
	case c.strict && !forwarding:
		return nil, errors.New("keyfuncs: RequireForwarding needs FromHeader")
	}
	if forwarding {
		c.errHeader = &headerError{keyreason.ErrInvalidHeader, c.header}
	}
	switch c.src {
	case srcXFF:
		return c.fromXFF, nil
	case srcForwarded:
		return c.fromForwarded, nil
	case srcHeader:
		return c.fromHeader, nil
	case srcChi:
		return c.fromChi, nil
	}
	return c.fromRemoteAddr, nil
}

// setSource records the source an option chose (header is the canonical name of a
// forwarding header, "" otherwise); a second choice is an error naming both options.
func (c *ipConfig) setSource(s source, header string) error {
	if c.srcSet {
		return fmt.Errorf("keyfuncs: %s and %s both choose the client address source; choose one", optionName(c.src, c.header), optionName(s, header))
	}
	c.src, c.header, c.srcSet = s, header, true
	return nil
}

// TrustedProxies names the proxies whose forwarding headers are believed, as CIDR
// prefixes ("10.0.0.0/8", "2001:db8::/32") or single addresses ("192.0.2.10"). Use it
// with [FromHeader]. When the TCP peer is not in
// the list, forwarding headers are ignored entirely and the peer is the client.
//
// List only addresses that clients cannot use themselves: an address in the list is
// believed about the hop before it. The option may be given more than once; the lists
// add up.
func TrustedProxies(cidrs ...string) IPOption {
	return func(c *ipConfig) error {
		if len(cidrs) == 0 {
			return errors.New("keyfuncs: TrustedProxies: at least one prefix is required")
		}
		for _, s := range cidrs {
			p, err := parseTrusted(s)
			if err != nil {
				return fmt.Errorf("keyfuncs: TrustedProxies: %q: %v", s, err)
			}
			c.trusted = append(c.trusted, p)
		}
		c.trustSet = true
		return nil
	}
}

func parseTrusted(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	var p netip.Prefix
	if strings.IndexByte(s, '/') >= 0 {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return p, err
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return p, err
		}
		if a.Zone() != "" {
			return p, errors.New("zones are not allowed")
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() {
		return p, errors.New("IPv4-mapped prefix: write the IPv4 form (addresses are unmapped before the check)")
	}
	if p.Bits() == 0 {
		return p, errors.New("a /0 prefix would trust every address")
	}
	return p.Masked(), nil
}

// FromHeader makes [ClientIP] read the client from the forwarding header name, the one
// your trusted proxies write, when the TCP peer is a trusted proxy (see [TrustedProxies],
// which it requires). From any other peer the header is ignored entirely and the peer is
// the client. The name is matched case-insensitively, in its canonical form
// ("x-real-ip" reads X-Real-Ip), and decides how the header is read:
//
//   - "X-Forwarded-For": a chain of addresses. All X-Forwarded-For lines are joined in
//     order and split on commas, and the chain is walked from the right, the peer being
//     the last hop: the first address that is not trusted is the client. Addresses left
//     of it were written by the client or by proxies you do not trust, and are never
//     read. If every address is trusted, the leftmost one is the client. Entries may
//     carry a port ("192.0.2.1:4711", "[2001:db8::1]:4711"). An entry that does not
//     parse, met before the client is found, is a malformed header; an "unknown" entry
//     means no client address.
//   - "Forwarded": the "for" parameters of the RFC 7239 Forwarded header, a chain walked
//     from the right as X-Forwarded-For's is; several Forwarded lines are one list, in
//     order. Its grammar is below.
//   - Any other name: a single-address header that your trusted proxy sets, such as
//     X-Real-IP (nginx), CF-Connecting-IP (Cloudflare), True-Client-IP or
//     Fastly-Client-IP. Use it only for a header that the proxy overwrites on every
//     request: several products pass True-Client-IP and Fastly-Client-IP through from
//     the client unless configured to strip them. When the header has several lines the
//     last one wins (the one written nearest to this server). A value that is not
//     exactly one IP address is a malformed header: there is no fallback to other values
//     or to the peer.
//
// Without the header (or with only empty entries) the peer is the client, a request made
// by the proxy itself, unless [RequireForwarding] is given.
//
// Forwarded is read by RFC 7239's grammar (section 4), strictly, since its quoting
// decides where the element your proxy wrote begins. A value is a token or a quoted
// string, so a node with an IPv6 address or a port must be quoted: for="[2001:db8::1]",
// for="192.0.2.1:4711" (and a host with a port, host="example.com:8080"). Parameter names
// are case-insensitive; '=' has no whitespace around it; spaces and tabs may surround ','
// and ';'; "for", "by", "host" and "proto" occur at most once in an element. A header
// that breaks the grammar anywhere, even left of the client, is a malformed header, as
// are a "for" value that is not a node of RFC 7239 section 6 (an IPv4 address, a
// bracketed IPv6 address without a zone, "unknown" or an obfuscated identifier, each
// with an optional port) and a chain of more than 64 elements: no address is guessed
// from a header that does not parse. A proxy that writes IPv6 addresses or ports
// unquoted must be configured to quote them. A hop reported as "unknown" or by an
// obfuscated identifier ("_hidden", with or without a port), or by an element without a
// "for" parameter, cannot be checked against the trusted list and hides the client's
// address: reaching it means no client address, never the address of the proxy that reported
// it (which would put every client of that proxy in one budget).
//
// ClientIP fails naming FromHeader when name is empty or holds a space, a tab, CR, LF or
// ':', and when FromHeader is given twice or with [ChiClientIP]: the client's address
// comes from one place.
func FromHeader(name string) IPOption {
	return func(c *ipConfig) error {
		if name == "" || strings.ContainsAny(name, " \t\r\n:") {
			return fmt.Errorf("keyfuncs: FromHeader: invalid header name %q", name)
		}
		h := http.CanonicalHeaderKey(name)
		s := srcHeader
		switch h {
		case "X-Forwarded-For":
			s = srcXFF
		case "Forwarded":
			s = srcForwarded
		}
		return c.setSource(s, h)
	}
}

// RequireForwarding makes a request from a trusted proxy that carries no forwarding
// header an error (no client address: 400) instead of an identity for the proxy itself.
// Use it when your proxies always set the header, so that a misconfigured proxy is
// refused loudly rather than sharing one budget among all its clients. Note that a proxy's own health checks
// then fail too, unless they are not rate limited.
func RequireForwarding() IPOption {
	return func(c *ipConfig) error { c.strict = true; return nil }
}

// ChiClientIP makes [ClientIP] use the address stored by chi's middleware.ClientIPFrom*
// middlewares (read with middleware.GetClientIPAddr), for applications that already run
// one of them: the trust decision is then that middleware's. The address is normalised
// and grouped like any other. A request without a stored address is an error (no client
// address: 400); this happens when the middleware is missing or refused the request's
// headers, and is never replaced by the peer's address.
//
// This is also the way to count proxy hops instead of naming them: run chi's
// middleware.ClientIPFromXFFTrustedProxies(n) and use ChiClientIP. Prefer
// [TrustedProxies]: a wrong count silently trusts a client-written entry.
func ChiClientIP() IPOption {
	return func(c *ipConfig) error { return c.setSource(srcChi, "") }
}

// Prefixes sets how clients are grouped into one identity: by their first ipv4 bits (1 to
// 32) and ipv6 bits (1 to 128). Without it they are 32 and 64.
//
// With 32, each IPv4 address is an identity and the key is the address
// ("203.0.113.7"); shorter prefixes give keys such as "203.0.113.0/24". IPv6 clients get
// one budget per /64 by default: a single subscriber usually holds a whole /64. Many
// providers delegate a /56 or a /48 to one subscriber, who can then spread requests over
// 256 or 65536 /64s; consider rules at /64 and at /56 or /48 side by side. With 128, the
// key is the address.
func Prefixes(ipv4, ipv6 int) IPOption {
	return func(c *ipConfig) error {
		if ipv4 < 1 || ipv4 > 32 {
			return fmt.Errorf("keyfuncs: Prefixes: ipv4: %d bits, want 1 to 32", ipv4)
		}
		if ipv6 < 1 || ipv6 > 128 {
			return fmt.Errorf("keyfuncs: Prefixes: ipv6: %d bits, want 1 to 128", ipv6)
		}
		c.v4Bits, c.v6Bits = ipv4, ipv6
		return nil
	}
}

// normalize unmaps IPv4-mapped IPv6 and drops the zone: the form every trust check and
// every key uses, so that no notation aliases a trusted or a different address.
func normalize(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}

func (c *ipConfig) trustedAddr(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func (c *ipConfig) key(a netip.Addr, raw string) string {
	return groupAddr(a, c.v4Bits, c.v6Bits, raw)
}

// groupAddr formats a's prefix of v4Bits or v6Bits. When the prefix is the whole address
// and raw already holds its canonical text, raw is returned and nothing is allocated.
func groupAddr(a netip.Addr, v4Bits, v6Bits int, raw string) string {
	bits := v6Bits
	if a.Is4() {
		bits = v4Bits
	}
	if bits == 32 && a.Is4() && strings.IndexByte(raw, ':') < 0 && len(raw) >= 7 {
		// netip parses IPv4 only in canonical dotted decimal (no leading zeros), so raw
		// text without a colon that parsed as IPv4 is already the canonical form.
		return raw
	}
	var buf [64]byte
	var b []byte
	if bits >= a.BitLen() {
		b = a.AppendTo(buf[:0])
		if string(b) == raw {
			return raw
		}
	} else {
		p, err := a.Prefix(bits)
		if err != nil {
			return ""
		}
		b = p.AppendTo(buf[:0])
	}
	return string(b)
}

// peer parses r.RemoteAddr: "host:port", "[v6]:port" or a bare address. It returns the
// host text as well, to let groupAddr reuse it.
func peer(remoteAddr string) (netip.Addr, string, bool) {
	host := remoteAddr
	if n := len(host); n > 0 && host[0] == '[' {
		i := strings.IndexByte(host, ']')
		if i < 0 || i+1 < n && host[i+1] != ':' {
			return netip.Addr{}, "", false
		}
		host = host[1:i]
	} else if i := strings.LastIndexByte(host, ':'); i >= 0 && strings.IndexByte(host, ':') == i {
		host = host[:i] // IPv4 with a port; a bare IPv6 address has several colons
	}
	if a, ok := parseIPv4(host); ok {
		return a, host, true
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, "", false
	}
	return normalize(a), host, true
}

// parseIPv4 parses dotted-decimal IPv4 in the form netip.ParseAddr accepts (four fields
// of 0 to 255, no leading zeros), faster than it does; anything else reports false and
// is left to netip.
func parseIPv4(s string) (netip.Addr, bool) {
	var ip [4]byte
	field, val, digits := 0, 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			if digits > 0 && val == 0 {
				return netip.Addr{}, false // a leading zero
			}
			val = val*10 + int(c-'0')
			if val > 255 {
				return netip.Addr{}, false
			}
			digits++
		case c == '.' && digits > 0 && field < 3:
			ip[field] = byte(val)
			field, val, digits = field+1, 0, 0
		default:
			return netip.Addr{}, false
		}
	}
	if field != 3 || digits == 0 {
		return netip.Addr{}, false
	}
	ip[3] = byte(val)
	return netip.AddrFrom4(ip), true
}

func (c *ipConfig) fromRemoteAddr(r *http.Request) (string, error) {
	a, host, ok := peer(r.RemoteAddr)
	if !ok {
		return "", keyreason.ErrNoClientIP
	}
	return c.key(a, host), nil
}

func (c *ipConfig) fromChi(r *http.Request) (string, error) {
	a := middleware.GetClientIPAddr(r.Context())
	if !a.IsValid() {
		return "", keyreason.ErrNoClientIP
	}
	return c.key(normalize(a), ""), nil
}

// trustedPeer returns the peer's key and false when the peer is not trusted (its
// headers are then ignored), or its address and true when it is.
func (c *ipConfig) trustedPeer(r *http.Request) (netip.Addr, string, bool, error) {
	a, host, ok := peer(r.RemoteAddr)
	if !ok {
		return a, "", false, keyreason.ErrNoClientIP
	}
	if !c.trustedAddr(a) {
		return a, c.key(a, host), false, nil
	}
	return a, host, true, nil
}

func (c *ipConfig) fromHeader(r *http.Request) (string, error) {
	p, k, trusted, err := c.trustedPeer(r)
	if err != nil || !trusted {
		return k, err
	}
	vs := r.Header[c.header]
	if len(vs) == 0 {
		if c.strict {
			return "", keyreason.ErrNoClientIP
		}
		return c.key(p, k), nil
	}
	v := strings.TrimSpace(vs[len(vs)-1])
	a, err := netip.ParseAddr(v)
	if err != nil {
		return "", c.errHeader
	}
	return c.key(normalize(a), v), nil
}

func (c *ipConfig) fromXFF(r *http.Request) (string, error) {
	p, k, trusted, err := c.trustedPeer(r)
	if err != nil || !trusted {
		return k, err
	}
	lines := r.Header["X-Forwarded-For"]
	leftmost, leftRaw, seen := p, k, false
	for i := len(lines) - 1; i >= 0; i-- {
		h := lines[i]
		for h != "" {
			var v string
			if j := strings.LastIndexByte(h, ','); j >= 0 {
				v, h = h[j+1:], h[:j]
			} else {
				v, h = h, ""
			}
			v = strings.Trim(v, " \t")
			if v == "" {
				continue
			}
			seen = true
			a, ok := parseHop(v)
			if !ok {
				if strings.EqualFold(v, "unknown") {
					return "", keyreason.ErrNoClientIP
				}
				return "", c.errHeader
			}
			if !c.trustedAddr(a) {
				return c.key(a, v), nil
			}
			leftmost, leftRaw = a, v
		}
	}
	if !seen && c.strict {
		return "", keyreason.ErrNoClientIP
	}
	return c.key(leftmost, leftRaw), nil
}

// parseHop parses one X-Forwarded-For entry: an address, "v4:port", "[v6]" or
// "[v6]:port". The result is normalised.
func parseHop(v string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(v); err == nil {
		return normalize(a), true
	}
	if ap, err := netip.ParseAddrPort(v); err == nil {
		return normalize(ap.Addr()), true
	}
	if n := len(v); n > 2 && v[0] == '[' && v[n-1] == ']' {
		if a, err := netip.ParseAddr(v[1 : n-1]); err == nil && a.Is6() {
			return normalize(a), true
		}
	}
	return netip.Addr{}, false
}
