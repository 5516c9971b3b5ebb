package policy

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// behindProxy is a policy whose one rule gives each client address two requests a
// minute, the client read from X-Forwarded-For as written by the proxies in 10.0.0.0/8.
const behindProxy = `client_ip:
  trusted_proxies: ["10.0.0.0/8", "2001:db8::/32"]
  header: X-Forwarded-For
rules:
  - {name: per-client, identity: ip, time: {limit: 2, window: 1m}}
`

// via is a request from peer carrying X-Forwarded-For xff ("" for none).
func via(peer, xff string) func() *http.Request {
	return func() *http.Request {
		if xff == "" {
			return request(peer, "/")
		}
		return request(peer, "/", "X-Forwarded-For", xff)
	}
}

func mustParse(t *testing.T, src string) *Policy {
	t.Helper()
	p, err := Parse("policy.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Behind a trusted proxy, two clients named in X-Forwarded-For spend two budgets, not
// the proxy's one.
func TestClientIPTrustedProxy(t *testing.T) {
	h := mustMiddleware(t, mustParse(t, behindProxy), frozen(t))
	if got, want := statuses(h, 3, via("10.0.0.1:4711", "203.0.113.1")), "200 200 429"; got != want {
		t.Errorf("first client: %s, want %s", got, want)
	}
	if got, want := statuses(h, 3, via("10.0.0.1:4711", "198.51.100.7, 10.1.2.3")), "200 200 429"; got != want {
		t.Errorf("second client, through two proxies: %s, want %s (a budget of its own)", got, want)
	}
	if got, want := statuses(h, 1, via("[2001:db8::1]:4711", "203.0.113.1")), "429"; got != want {
		t.Errorf("first client through the IPv6 proxy: %s, want %s (its budget is spent)", got, want)
	}
	// A request the proxy makes itself, without the header, is the proxy's.
	if got, want := statuses(h, 3, via("10.0.0.1:4711", "")), "200 200 429"; got != want {
		t.Errorf("the proxy itself: %s, want %s", got, want)
	}
}

// From a peer that is not a trusted proxy the header is ignored: whatever it claims,
// the peer is the client.
func TestClientIPUntrustedPeerIgnoresHeader(t *testing.T) {
	h := mustMiddleware(t, mustParse(t, behindProxy), frozen(t))
	got := statuses(h, 1, via("192.0.2.9:1", "203.0.113.1")) + " " +
		statuses(h, 1, via("192.0.2.9:1", "203.0.113.2")) + " " +
		statuses(h, 1, via("192.0.2.9:1", "203.0.113.3"))
	if want := "200 200 429"; got != want {
		t.Errorf("one peer claiming three clients: %s, want %s (one budget)", got, want)
	}
	// The claimed client's own budget is untouched.
	if got, want := statuses(h, 2, via("10.0.0.1:1", "203.0.113.1")), "200 200"; got != want {
		t.Errorf("203.0.113.1 through the proxy: %s, want %s", got, want)
	}
}

// Without client_ip, identity ip is the peer, whatever the header says: today's
// behaviour of a file without the section.
func TestClientIPAbsentReadsPeer(t *testing.T) {
	h := mustMiddleware(t, mustParse(t, "rules:\n  - {name: per-client, identity: ip, time: {limit: 2, window: 1m}}\n"), frozen(t))
	got := statuses(h, 1, via("10.0.0.1:1", "203.0.113.1")) + " " + statuses(h, 2, via("10.0.0.1:1", "203.0.113.2"))
	if want := "200 200 429"; got != want {
		t.Errorf("two clients behind one proxy: %s, want %s (the proxy's one budget)", got, want)
	}
}

// match.ip reads the client as identity ip does: the forwarded client behind a trusted
// proxy, the peer otherwise, and the whole address even when identities are grouped.
func TestClientIPMatch(t *testing.T) {
	p := mustParse(t, `client_ip:
  trusted_proxies: [10.0.0.0/8]
  header: X-Forwarded-For
  ipv4_prefix: 24
rules:
  - name: one-host
    identity: ip
    match: {ip: [203.0.113.9]}
    time: {limit: 1, window: 1m}
`)
	h := mustMiddleware(t, p, frozen(t))
	if got, want := statuses(h, 2, via("10.0.0.1:1", "203.0.113.9")), "200 429"; got != want {
		t.Errorf("203.0.113.9 through the proxy: %s, want %s (the rule applies)", got, want)
	}
	if got, want := statuses(h, 3, via("10.0.0.1:1", "203.0.113.10")), "200 200 200"; got != want {
		t.Errorf("203.0.113.10, in the same /24 identity: %s, want %s (not the address matched)", got, want)
	}
	if got, want := statuses(h, 3, via("198.51.100.1:1", "203.0.113.9")), "200 200 200"; got != want {
		t.Errorf("an untrusted peer claiming 203.0.113.9: %s, want %s (the rule does not apply)", got, want)
	}
	if got, want := statuses(h, 3, via("10.0.0.1:1", "")), "200 200 200"; got != want {
		t.Errorf("the proxy itself: %s, want %s (the rule does not apply)", got, want)
	}
	// The header in a request from a trusted proxy that does not parse: the client is
	// unknown, in no range.
	if r := via("10.0.0.1:1", "not-an-address")(); p.rules[0].match.matches(r) {
		t.Errorf("a malformed X-Forwarded-For matched 203.0.113.9")
	}
}

// ipv4_prefix and ipv6_prefix group identities as keyfuncs.Prefixes does.
func TestClientIPPrefixes(t *testing.T) {
	h := mustMiddleware(t, mustParse(t, `client_ip: {ipv4_prefix: 24, ipv6_prefix: 48}
rules:
  - {name: per-net, identity: ip, time: {limit: 2, window: 1m}}
`), frozen(t))
	got := statuses(h, 1, via("203.0.113.1:1", "")) + " " + statuses(h, 2, via("203.0.113.200:1", ""))
	if want := "200 200 429"; got != want {
		t.Errorf("two addresses of one /24: %s, want %s (one budget)", got, want)
	}
	got = statuses(h, 1, via("[2001:db8:1:2::1]:1", "")) + " " + statuses(h, 2, via("[2001:db8:1:ffff::1]:1", ""))
	if want := "200 200 429"; got != want {
		t.Errorf("two /64s of one /48: %s, want %s (one budget)", got, want)
	}
}

// A file that gives one prefix keeps the other's default: IPv4 by address, IPv6 by /64.
func TestClientIPOnePrefix(t *testing.T) {
	h := mustMiddleware(t, mustParse(t, `client_ip: {ipv6_prefix: 48}
rules:
  - {name: per-net, identity: ip, time: {limit: 2, window: 1m}}
`), frozen(t))
	got := statuses(h, 2, via("203.0.113.1:1", "")) + " " + statuses(h, 2, via("203.0.113.200:1", ""))
	if want := "200 200 200 200"; got != want {
		t.Errorf("ipv6_prefix alone, two IPv4 addresses of one /24: %s, want %s (a budget each)", got, want)
	}
	h = mustMiddleware(t, mustParse(t, `client_ip: {ipv4_prefix: 24}
rules:
  - {name: per-net, identity: ip, time: {limit: 2, window: 1m}}
`), frozen(t))
	got = statuses(h, 2, via("[2001:db8:1:2::1]:1", "")) + " " + statuses(h, 2, via("[2001:db8:1:ffff::1]:1", ""))
	if want := "200 200 200 200"; got != want {
		t.Errorf("ipv4_prefix alone, two /64s of one /48: %s, want %s (a budget each)", got, want)
	}
	got = statuses(h, 1, via("[2001:db8:1:2::1]:1", "")) + " " + statuses(h, 1, via("[2001:db8:1:2::2]:1", ""))
	if want := "429 429"; got != want {
		t.Errorf("ipv4_prefix alone, another address of a spent /64: %s, want %s (one budget)", got, want)
	}
}

// require_forwarding: a trusted proxy's request without the header is refused, not
// counted as the proxy's.
func TestClientIPRequireForwarding(t *testing.T) {
	h := mustMiddleware(t, mustParse(t, `client_ip:
  trusted_proxies: [10.0.0.0/8]
  header: x-real-ip
  require_forwarding: true
rules:
  - {name: per-client, identity: ip, time: {limit: 2, window: 1m}}
`), frozen(t))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, via("10.0.0.1:1", "")())
	if rec.Code != http.StatusBadRequest {
		t.Errorf("the proxy without X-Real-Ip: %d, want 400 (the client is unknown)", rec.Code)
	}
	realIP := func() *http.Request { return request("10.0.0.1:1", "/", "X-Real-IP", "203.0.113.1") }
	if got, want := statuses(h, 3, realIP), "200 200 429"; got != want {
		t.Errorf("a client in X-Real-IP: %s, want %s", got, want)
	}
}

// A reload that adds the client_ip section takes effect in the watcher's middleware:
// the clients behind the proxy, one budget before it, get one each after it.
func TestClientIPReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeAtomic(t, path, []byte("rules:\n  - {name: per-client, identity: ip, time: {limit: 2, window: 1m}}\n"))
	w, ch := watched(t, path, time.Hour)
	mw, err := w.Middleware(frozen(t))
	if err != nil {
		t.Fatal(err)
	}
	h := mw(okHandler)
	got := statuses(h, 1, via("10.0.0.1:1", "203.0.113.1")) + " " + statuses(h, 2, via("10.0.0.1:1", "203.0.113.2"))
	if want := "200 200 429"; got != want {
		t.Fatalf("before the reload: %s, want %s (the proxy's one budget)", got, want)
	}
	if err := os.WriteFile(path, []byte(behindProxy), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if r := next(t, ch); r.err != nil {
		t.Fatal(r.err)
	}
	for _, client := range []string{"203.0.113.1", "203.0.113.2"} {
		if got, want := statuses(h, 3, via("10.0.0.1:1", client)), "200 200 429"; got != want {
			t.Errorf("%s after the reload: %s, want %s (a budget of its own)", client, got, want)
		}
	}
	// And back: without the section the proxy is the client again, its budget spent.
	if err := os.WriteFile(path, []byte("rules:\n  - {name: per-client, identity: ip, time: {limit: 2, window: 1m}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if r := next(t, ch); r.err != nil {
		t.Fatal(r.err)
	}
	if got, want := statuses(h, 1, via("10.0.0.1:1", "203.0.113.3")), "429"; got != want {
		t.Errorf("a new client after the section is gone: %s, want %s (the proxy's spent budget)", got, want)
	}
}

// identity ip and match.ip are built once per policy, at Parse, not per request or per
// Middleware call.
func TestClientIPBuiltAtParse(t *testing.T) {
	p := mustParse(t, behindProxy)
	if p.clientIP == nil {
		t.Fatal("the policy has no client key function after Parse")
	}
	id, err := p.identity("ip")
	if err != nil {
		t.Fatal(err)
	}
	k, err := id(via("10.0.0.1:1", "203.0.113.1")())
	if err != nil || k != "203.0.113.1" {
		t.Errorf("identity ip = %q, %v; want 203.0.113.1", k, err)
	}
}

// match.ip behind a trusted proxy allocates nothing: the forwarded client is read
// without a copy.
func TestClientIPMatchAllocs(t *testing.T) {
	p := mustParse(t, behindProxy+"  - {name: office, identity: ip, match: {ip: [203.0.113.0/24]}, unlimited: true, replaces: [per-client]}\n")
	buf := make([]applied, 0, 8)
	for _, r := range []*http.Request{via("10.0.0.1:1", "203.0.113.9, 10.0.0.2")(), via("[2001:db8::1]:1", "2001:db8:ffff::1")()} {
		if n := testing.AllocsPerRun(100, func() { buf = p.resolve(r, buf[:0]) }); n != 0 {
			t.Errorf("resolve of %s via %s allocates %v times per request, want 0", r.Header.Get("X-Forwarded-For"), r.RemoteAddr, n)
		}
	}
	if got := decided(p, via("10.0.0.1:1", "203.0.113.9")()); len(got) != 1 || !strings.HasPrefix(got[0], "office") {
		t.Errorf("203.0.113.9 through the proxy is decided under %v, want office only", got)
	}
}

// Without client_ip, match.ip reads the peer as identity ip does: with or without a port,
// IPv4-mapped IPv6 as IPv4.
func TestClientIPAbsentMatchReadsPeer(t *testing.T) {
	p := mustParse(t, "rules:\n  - {name: lan, identity: ip, match: {ip: [192.0.2.0/24]}, unlimited: true}\n")
	for addr, want := range map[string]bool{
		"192.0.2.1:1": true, "192.0.2.1": true, "[::ffff:192.0.2.1]:1": true,
		"198.51.100.1:1": false, "[2001:db8::1]:1": false, "@": false,
	} {
		if got := p.rules[0].match.matches(via(addr, "192.0.2.1")()); got != want {
			t.Errorf("match.ip 192.0.2.0/24 of peer %q = %v, want %v", addr, got, want)
		}
	}
}
