package keyfuncs_test

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/ratebudget/ratebudget/keyfuncs"
)

// oracleBudget bounds the address text mentions reads for one input. It parses every
// substring of every run of address characters (up to 2,080 parses per 64-byte run,
// several microseconds per byte), so an input of a few megabytes, which the fuzzing
// engine produces in time, would take more than the 10 seconds after which the engine
// kills the worker ("fuzzing process hung or terminated unexpectedly", and no crasher,
// since no input is at fault). Beyond the budget the key is not judged against the
// text; every other check still runs.
const oracleBudget = 32 << 10

// mentions reports whether key is the key of an address written anywhere in the texts:
// the oracle for "the result is the peer or a member of the chain". It knows nothing of
// the header syntax: it tries every substring of every run of address characters, in
// order, and stops at the first match. decided is false when the budget ran out first.
func mentions(key string, texts ...string) (found, decided bool) {
	budget := oracleBudget
	for _, s := range texts {
		s = strings.ReplaceAll(s, `\`, "") // quoted-pairs in Forwarded
		for s != "" {
			i := strings.IndexFunc(s, isAddrChar)
			if i < 0 {
				break
			}
			s = s[i:]
			n := strings.IndexFunc(s, func(c rune) bool { return !isAddrChar(c) })
			if n < 0 {
				n = len(s)
			}
			r := s[:n]
			s = s[n:]
			if len(r) > 64 {
				r = r[:64]
			}
			if budget -= len(r); budget < 0 {
				return false, false
			}
			for i := 0; i < len(r); i++ {
				for j := i + 1; j <= len(r); j++ {
					if a, err := netip.ParseAddr(r[i:j]); err == nil && keyfuncs.GroupIP(a) == key {
						return true, true
					}
				}
			}
		}
	}
	return false, true
}

func isAddrChar(c rune) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == '.' || c == ':'
}

func checkKey(t *testing.T, key string, err error, peer string, headers ...string) {
	t.Helper()
	if err != nil {
		if key != "" {
			t.Fatalf("key %q returned with error %v", key, err)
		}
		return
	}
	if strings.ContainsAny(key, "{}") || len(key) > 64 {
		t.Fatalf("unsafe key %q", key)
	}
	if found, decided := mentions(key, append([]string{peer}, headers...)...); decided && !found {
		t.Fatalf("key %q is neither the peer %q nor in the chain %q", key, peer, headers)
	}
}

func untrustedPeerKey(peer string) (string, bool) {
	ap, err := netip.ParseAddrPort(peer)
	if err != nil {
		return "", false
	}
	a := ap.Addr().Unmap()
	if a.Is4() && netip.MustParsePrefix("10.0.0.0/8").Contains(a) {
		return "", false
	}
	if a.Is6() && netip.MustParsePrefix("2001:db8:ffff::/48").Contains(a.WithZone("")) {
		return "", false
	}
	return keyfuncs.GroupIP(a), true
}

func FuzzXFF(f *testing.F) {
	f.Add("10.0.0.1:80", "1.1.1.1, 203.0.113.7", "10.0.0.5")
	f.Add("10.0.0.1:80", "", "")
	f.Add("10.0.0.1:80", "garbage, ::ffff:10.0.0.2", "[2001:db8::1]:80")
	f.Add("198.51.100.1:80", "203.0.113.7", "")
	f.Add("[::ffff:10.0.0.1]:80", "unknown", "fe80::1%eth0")
	f.Add("@", "203.0.113.7", "")
	f.Add("[2001:db8:ffff::1]:1", " , ,", "10.1.1.1:99")
	fn := mustClientIP(f, keyfuncs.TrustedProxies("10.0.0.0/8", "2001:db8:ffff::/48"), keyfuncs.FromHeader("X-Forwarded-For"))
	f.Fuzz(func(t *testing.T, peer, xff1, xff2 string) {
		r := req(peer)
		r.Header["X-Forwarded-For"] = []string{xff1, xff2}
		key, err := fn(r)
		checkKey(t, key, err, peer, xff1, xff2)
		if want, ok := untrustedPeerKey(peer); ok && (key != want || err != nil) {
			t.Fatalf("untrusted peer %q: got (%q, %v), want %q", peer, key, err, want)
		}
	})
}

func FuzzForwarded(f *testing.F) {
	f.Add("10.0.0.1:80", `for=1.1.1.1, for="[2001:db8:cafe::17]:4711";proto=https`, "for=10.0.0.2")
	f.Add("10.0.0.1:80", "for=unknown", "")
	f.Add("10.0.0.1:80", "for=_hidden, for=203.0.113.7", "")
	f.Add("10.0.0.1:80", `for="\[::ffff:10.0.0.3\]"`, `for="203.0.113.7:_p"`)
	f.Add("10.0.0.1:80", `for="`, "by=x;;for=1.2.3.4,,")
	f.Add("198.51.100.1:80", "for=203.0.113.7", "")
	f.Add("10.0.0.1:80", `host="a,b";for=203.0.113.9`, "")
	// Forms RFC 7239 does not allow: non-token characters unquoted, whitespace around
	// '=', a quoted-pair of a control, a registered parameter twice, an IPv6 zone.
	f.Add("10.0.0.1:80", "for=[2001:db8::1]", "for=192.0.2.1:8080")
	f.Add("10.0.0.1:80", "for=203.0.113.7;host=example.com:8080", "for=_hidden:_p")
	f.Add("10.0.0.1:80", "for =203.0.113.7", "for= 203.0.113.7")
	f.Add("10.0.0.1:80", "for=203.0.113.7;host=\"a\\\x01\"", "proto=http;PROTO=https;for=203.0.113.7")
	f.Add("10.0.0.1:80", `for="[fe80::1%eth0]"`, `for="unknown:80", for="_x:8080"`)
	f.Add("10.0.0.1:80", `for=6.6.6.6;x=", for=203.0.113.7`, `for=6.6.6.6;x=", for="[2001:db8::7]:1"`)
	f.Add("10.0.0.1:80", `for=6.6.6.6;x="`, `", for=203.0.113.7`)
	f.Add("10.0.0.1:80", "For=203.0.113.7 ;\tproto=https , for=10.0.0.3", "")
	fn := mustClientIP(f, keyfuncs.TrustedProxies("10.0.0.0/8", "2001:db8:ffff::/48"), keyfuncs.FromHeader("Forwarded"))
	f.Fuzz(func(t *testing.T, peer, fwd1, fwd2 string) {
		r := req(peer)
		r.Header["Forwarded"] = []string{fwd1, fwd2}
		key, err := fn(r)
		checkKey(t, key, err, peer, fwd1, fwd2)
		if want, ok := untrustedPeerKey(peer); ok && (key != want || err != nil) {
			t.Fatalf("untrusted peer %q: got (%q, %v), want %q", peer, key, err, want)
		}
	})
}

// FuzzForwardedAppended: whatever a client sends in Forwarded, when its trusted proxy
// appends the element it saw (on the same line, as nginx's "$http_forwarded, for=..."
// does, or on a line of its own), the client's identity is that element's address or
// an error: never an address the client wrote.
func FuzzForwardedAppended(f *testing.F) {
	f.Add("", "")
	f.Add("for=203.0.113.7", "for=10.0.0.9")
	f.Add(`for=6.6.6.6;x="`, "")
	f.Add(`for="`, `x="a\`)
	f.Add("for=6.6.6.6;proto", "for=6.6.6.6;x=")
	f.Add(`for="[2001:db8::6]:1";host="a,for=6.6.6.6"`, "for=6.6.6.6\\")
	f.Add("for=6.6.6.6, for=10.0.0.9", "for=6.6.6.6,for=10.0.0.8;")
	proxy := []struct{ element, want string }{ // what the proxy appends, and its key
		{"for=198.51.100.77", "198.51.100.77"},
		{`for="198.51.100.77:4711";proto=https`, "198.51.100.77"},
		{`for="[2001:db8:77::1]:4711"`, "2001:db8:77::/64"},
	}
	for _, p := range proxy {
		f.Add(p.element, p.element) // the client repeats an element
	}
	fn := mustClientIP(f, keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader("Forwarded"))
	f.Fuzz(func(t *testing.T, client1, client2 string) {
		for _, tc := range proxy {
			for _, lines := range [][]string{
				{client1, client2 + ", " + tc.element},
				{client1, client2, tc.element},
			} {
				r := req("10.0.0.1:80")
				r.Header["Forwarded"] = lines
				key, err := fn(r)
				if err == nil && key != tc.want || err != nil && key != "" {
					t.Fatalf("%q: got (%q, %v), want %q or an error", lines, key, err, tc.want)
				}
			}
		}
	})
}

func FuzzSingleAddressHeader(f *testing.F) {
	f.Add("10.0.0.1:80", "203.0.113.7", "::ffff:1.2.3.4")
	f.Add("10.0.0.1:80", "", "bogus")
	// Megabytes of address characters, as the engine grows them: the oracle stops within
	// its budget, where trying every substring of every run took over 10 seconds.
	big := strings.Repeat(strings.Repeat("a:", 32)+"-", 1<<15)
	f.Add("198.51.100.1:80", "", big)
	f.Add("10.0.0.1:80", "", "fe80::1%"+big)
	fn := mustClientIP(f, keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader("X-Real-IP"))
	f.Fuzz(func(t *testing.T, peer, v1, v2 string) {
		r := req(peer)
		r.Header["X-Real-Ip"] = []string{v1, v2}
		key, err := fn(r)
		checkKey(t, key, err, peer, v2) // only the last line may be read
	})
}

func FuzzHeaderKeys(f *testing.F) {
	f.Add("acct-1")
	f.Add("{tag}")
	f.Add(strings.Repeat("x", 300))
	hdr := keyfuncs.Header("X-Account")
	fromFunc := keyfuncs.Func(func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil })
	f.Fuzz(func(t *testing.T, v string) {
		r := req("203.0.113.7:1")
		r.Header["X-Account"] = []string{v}
		for _, fn := range []keyFunc{hdr, fromFunc} {
			key, err := fn(r)
			if err == nil && (key == "" || len(key) > keyfuncs.MaxValueLen || strings.ContainsAny(key, "{}")) {
				t.Fatalf("%q: unsafe key %q", v, key)
			}
		}
	})
}

// TestMentions: the oracle finds an address anywhere in the texts, in any notation, and
// says so when it cannot tell.
func TestMentions(t *testing.T) {
	big := strings.Repeat("a:a:-", oracleBudget)
	for _, tc := range []struct {
		key            string
		texts          []string
		found, decided bool
	}{
		{"203.0.113.7", []string{"10.0.0.1:80", "x=203.0.113.7;y"}, true, true},
		{"203.0.113.7", []string{"10.0.0.1:80", `for="[::ffff:cb00:7107]"`}, true, true},
		{"2001:db8:1:2::/64", []string{"@", "2001:db8:1:2:3:4:5:6"}, true, true},
		{"203.0.113.8", []string{"10.0.0.1:80", "203.0.113.7"}, false, true},
		{"203.0.113.7", []string{"10.0.0.1:80", big + "203.0.113.7"}, false, false},
		{"203.0.113.7", []string{"203.0.113.7:1", big}, true, true},
	} {
		if found, decided := mentions(tc.key, tc.texts...); found != tc.found || decided != tc.decided {
			t.Errorf("mentions(%q, %.40q) = %v, %v; want %v, %v", tc.key, tc.texts, found, decided, tc.found, tc.decided)
		}
	}
}

// FuzzHashedHeaderSpellings: one credential, whatever the case of its scheme and the
// whitespace around and inside it, and on one line or two, is one identity.
func FuzzHashedHeaderSpellings(f *testing.F) {
	f.Add("Bearer", "mF_9.B5f-4.1JqM", uint64(0b101), uint8(3))
	f.Add("Basic", "YWxpY2U6cHc=", uint64(1), uint8(0))
	f.Add("Digest", `username="a", realm="b"`, uint64(0xff), uint8(7))
	f.Add("x-custom", "T0k3n", uint64(2), uint8(1))
	fn := keyfuncs.HashedHeader("Authorization", []byte("0123456789abcdef"))
	f.Fuzz(func(t *testing.T, scheme, token string, mask uint64, spaces uint8) {
		if scheme == "" || token == "" || strings.TrimSpace(token) != token {
			return
		}
		b := []byte(scheme)
		for i, c := range b {
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
				return // not a token: not a scheme
			}
			if mask>>(i%64)&1 == 1 && ('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
				b[i] ^= 0x20
			}
		}
		ws := [...]string{" ", "  ", "\t", " \t "}
		v1 := scheme + " " + token
		v2 := ws[spaces%4] + string(b) + ws[spaces/4%4] + token + ws[spaces/16%4]
		k1, err1 := keyOf(t, fn, "Authorization", v1)
		k2, err2 := keyOf(t, fn, "Authorization", v2)
		k3, err3 := keyOf(t, fn, "Authorization", v1, "", v2)
		if err1 != nil || err2 != nil || err3 != nil || len(k1) != keyfuncs.HashedLen || k1 != k2 || k1 != k3 {
			t.Fatalf("%q, %q: got (%q, %v), (%q, %v), (%q, %v)", v1, v2, k1, err1, k2, err2, k3, err3)
		}
	})
}
