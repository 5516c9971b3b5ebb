package keyfuncs_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/ratebudget/ratebudget/internal/keyreason"
	"github.com/ratebudget/ratebudget/keyfuncs"
)

// req builds a request from peer with header lines given as "Name: value" pairs.
func req(peer string, lines ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = peer
	for _, l := range lines {
		name, value, _ := strings.Cut(l, ":")
		r.Header.Add(name, strings.TrimPrefix(value, " "))
	}
	return r
}

func mustClientIP(t testing.TB, opts ...keyfuncs.IPOption) keyFunc {
	t.Helper()
	fn, err := keyfuncs.ClientIP(opts...)
	if err != nil {
		t.Fatalf("ClientIP: %v", err)
	}
	return fn
}

type ipCase struct {
	name    string
	peer    string
	headers []string
	want    string
	wantErr error
}

func runIP(t *testing.T, fn keyFunc, tt []ipCase) {
	t.Helper()
	for _, tc := range tt {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fn(req(tc.peer, tc.headers...))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got (%q, %v), want error %v", got, err, tc.wantErr)
				}
				if got != "" {
					t.Fatalf("got key %q with error %v, want none", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got (%q, %v), want %q", got, err, tc.want)
			}
		})
	}
}

func TestClientIP_RemoteAddr(t *testing.T) {
	t.Parallel()
	runIP(t, mustClientIP(t), []ipCase{
		{name: "ipv4_with_port", peer: "203.0.113.7:5555", want: "203.0.113.7"},
		{name: "bare_ipv4", peer: "203.0.113.7", want: "203.0.113.7"},
		{name: "ipv6_with_port", peer: "[2001:db8:1:2:3:4:5:6]:443", want: "2001:db8:1:2::/64"},
		{name: "bare_ipv6", peer: "2001:db8:1:2::9", want: "2001:db8:1:2::/64"},
		{name: "mapped_ipv4", peer: "[::ffff:203.0.113.7]:80", want: "203.0.113.7"},
		{name: "zone_dropped", peer: "[fe80::1%eth0]:80", want: "fe80::/64"},
		{name: "headers_ignored", peer: "203.0.113.7:1", headers: []string{"X-Forwarded-For: 198.51.100.1", "X-Real-IP: 198.51.100.2"}, want: "203.0.113.7"},
		{name: "unix_socket", peer: "@", wantErr: keyreason.ErrNoClientIP},
		{name: "unix_path", peer: "/run/app.sock", wantErr: keyreason.ErrNoClientIP},
		{name: "empty", peer: "", wantErr: keyreason.ErrNoClientIP},
		{name: "hostname", peer: "localhost:80", wantErr: keyreason.ErrNoClientIP},
		{name: "unclosed_bracket", peer: "[2001:db8::1:80", wantErr: keyreason.ErrNoClientIP},
		{name: "junk_after_bracket", peer: "[2001:db8::1]x", wantErr: keyreason.ErrNoClientIP},
		{name: "bracket_no_port", peer: "[2001:db8::1]", want: "2001:db8::/64"},
	})
}

func TestClientIP_XFF(t *testing.T) {
	t.Parallel()
	fn := mustClientIP(t, keyfuncs.TrustedProxies("10.0.0.0/8", "2001:db8:ffff::/48"), keyfuncs.FromHeader("X-Forwarded-For"))
	runIP(t, fn, []ipCase{
		{name: "one_proxy", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: 203.0.113.7"}, want: "203.0.113.7"},
		{name: "spoofed_left_entries", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: 1.1.1.1, 2.2.2.2, 203.0.113.7"}, want: "203.0.113.7"},
		{name: "trusted_hops_skipped", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: 1.1.1.1, 203.0.113.7, 10.1.1.1, 10.2.2.2"}, want: "203.0.113.7"},
		{name: "repeated_lines_merged", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: 1.1.1.1, 203.0.113.9", "X-Forwarded-For: 203.0.113.7, 10.0.0.5"}, want: "203.0.113.7"},
		{name: "repeated_lines_order", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: 203.0.113.7", "X-Forwarded-For: 10.0.0.5"}, want: "203.0.113.7"},
		{name: "spaces_and_empty_entries", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For:  ,203.0.113.7 ,, \t10.0.0.2 ,"}, want: "203.0.113.7"},
		{name: "untrusted_peer_ignores_header", peer: "198.51.100.1:80", headers: []string{"X-Forwarded-For: 203.0.113.7"}, want: "198.51.100.1"},
		{name: "untrusted_peer_ignores_garbage", peer: "198.51.100.1:80", headers: []string{"X-Forwarded-For: garbage"}, want: "198.51.100.1"},
		{name: "all_trusted_leftmost", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: 10.9.9.9, 10.8.8.8"}, want: "10.9.9.9"},
		{name: "no_header_is_peer", peer: "10.0.0.1:80", want: "10.0.0.1"},
		{name: "garbage_before_client", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: 203.0.113.7, bogus"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "garbage_left_of_client_ignored", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: bogus, 203.0.113.7"}, want: "203.0.113.7"},
		{name: "unknown_entry", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: unknown"}, wantErr: keyreason.ErrNoClientIP},
		{name: "mapped_trusted_alias", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: 203.0.113.7, ::ffff:10.0.0.9"}, want: "203.0.113.7"},
		{name: "mapped_client_unmapped", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: ::ffff:203.0.113.7"}, want: "203.0.113.7"},
		{name: "zoned_trusted_alias", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: 203.0.113.7, 2001:db8:ffff::1%eth0"}, want: "203.0.113.7"},
		{name: "mapped_peer_trusted", peer: "[::ffff:10.0.0.1]:80", headers: []string{"X-Forwarded-For: 203.0.113.7"}, want: "203.0.113.7"},
		{name: "ipv6_bracket_port", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: [2001:db8:1:2::7]:4711"}, want: "2001:db8:1:2::/64"},
		{name: "ipv6_bracket_no_port", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: [2001:db8:1:2::7]"}, want: "2001:db8:1:2::/64"},
		{name: "ipv4_with_port", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: 203.0.113.7:4711"}, want: "203.0.113.7"},
		{name: "ipv6_peer_trusted", peer: "[2001:db8:ffff::2]:80", headers: []string{"X-Forwarded-For: 2001:db8:aaaa:1::5"}, want: "2001:db8:aaaa:1::/64"},
		{name: "unix_peer", peer: "@", headers: []string{"X-Forwarded-For: 203.0.113.7"}, wantErr: keyreason.ErrNoClientIP},
		{name: "other_header_ignored", peer: "10.0.0.1:80", headers: []string{"X-Real-IP: 203.0.113.7"}, want: "10.0.0.1"},
	})
}

func TestClientIP_RequireForwarding(t *testing.T) {
	t.Parallel()
	fn := mustClientIP(t, keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader("X-Forwarded-For"), keyfuncs.RequireForwarding())
	runIP(t, fn, []ipCase{
		{name: "no_header", peer: "10.0.0.1:80", wantErr: keyreason.ErrNoClientIP},
		{name: "empty_header", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: , "}, wantErr: keyreason.ErrNoClientIP},
		{name: "with_header", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: 203.0.113.7"}, want: "203.0.113.7"},
		{name: "untrusted_peer", peer: "203.0.113.8:80", want: "203.0.113.8"},
	})
}

func TestClientIP_Forwarded(t *testing.T) {
	t.Parallel()
	fn := mustClientIP(t, keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader("Forwarded"))
	runIP(t, fn, []ipCase{
		{name: "plain", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=203.0.113.7"}, want: "203.0.113.7"},
		{name: "params_and_case", peer: "10.0.0.1:80", headers: []string{"Forwarded: proto=https;FOR=203.0.113.7;by=10.0.0.1"}, want: "203.0.113.7"},
		{name: "quoted_v6_port", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="[2001:db8:cafe::17]:4711"`}, want: "2001:db8:cafe::/64"},
		{name: "quoted_v4_port", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="203.0.113.7:47011"`}, want: "203.0.113.7"},
		{name: "quoted_escaped", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="\[2001:db8::1\]"`}, want: "2001:db8::/64"},
		{name: "chain_spoofed_left", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=1.1.1.1, for=203.0.113.7;proto=http, for=10.2.2.2"}, want: "203.0.113.7"},
		{name: "repeated_lines", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=1.1.1.1", "Forwarded: for=203.0.113.7, for=10.3.3.3"}, want: "203.0.113.7"},
		{name: "comma_in_quoted_param", peer: "10.0.0.1:80", headers: []string{`Forwarded: for=203.0.113.7;host="a,b"`}, want: "203.0.113.7"},
		{name: "unknown_untrusted_hop", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=203.0.113.9, for=unknown"}, wantErr: keyreason.ErrNoClientIP},
		{name: "obfuscated_hop", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=_hidden"}, wantErr: keyreason.ErrNoClientIP},
		{name: "obfuscated_quoted", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="_gazonk"`}, wantErr: keyreason.ErrNoClientIP},
		{name: "element_without_for", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=203.0.113.7, proto=https"}, wantErr: keyreason.ErrNoClientIP},
		{name: "unknown_left_of_client_ignored", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=unknown, for=203.0.113.7"}, want: "203.0.113.7"},
		{name: "obfuscated_port_ok", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="203.0.113.7:_p1"`}, want: "203.0.113.7"},
		{name: "mapped_trusted_alias", peer: "10.0.0.1:80", headers: []string{`Forwarded: for=203.0.113.7, for="[::ffff:10.0.0.4]"`}, want: "203.0.113.7"},
		{name: "all_trusted_leftmost", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=10.1.1.1, for=10.2.2.2"}, want: "10.1.1.1"},
		{name: "no_header_is_peer", peer: "10.0.0.1:80", want: "10.0.0.1"},
		{name: "untrusted_peer", peer: "203.0.113.8:80", headers: []string{"Forwarded: for=1.2.3.4"}, want: "203.0.113.8"},
		{name: "untrusted_peer_garbage", peer: "203.0.113.8:80", headers: []string{`Forwarded: for="`}, want: "203.0.113.8"},
		{name: "mixed_case_for", peer: "10.0.0.1:80", headers: []string{"Forwarded: For=203.0.113.7;Proto=https"}, want: "203.0.113.7"},
		{name: "obfuscated_unquoted_is_token", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=_hidden.1-x"}, wantErr: keyreason.ErrNoClientIP},
		{name: "unknown_with_port", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="unknown:4711"`}, wantErr: keyreason.ErrNoClientIP},
		{name: "obfuscated_with_port", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="_hidden:_p"`}, wantErr: keyreason.ErrNoClientIP},
		{name: "obfuscated_with_numeric_port", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="_hidden:8080"`}, wantErr: keyreason.ErrNoClientIP},
		{name: "empty_elements_and_pairs", peer: "10.0.0.1:80", headers: []string{"Forwarded: , for=203.0.113.7;;proto=http; ,, "}, want: "203.0.113.7"},
		{name: "ows_around_separators", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=1.1.1.1 ,\tfor=203.0.113.7 ; proto=http"}, want: "203.0.113.7"},
		{name: "quoted_token", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="203.0.113.7";proto="https"`}, want: "203.0.113.7"},
		{name: "quoted_pair_in_other_param", peer: "10.0.0.1:80", headers: []string{`Forwarded: for=203.0.113.7;host="a\"b,c"`}, want: "203.0.113.7"},
		{name: "quoted_host_port", peer: "10.0.0.1:80", headers: []string{`Forwarded: for=203.0.113.7;host="example.com:8080"`}, want: "203.0.113.7"},
		// RFC 7239 section 6: '[', ']' and ':' are not token characters, so a node with
		// an IPv6 address or a port must be quoted. Unquoted, it is not the header's syntax.
		{name: "unquoted_v6", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=[2001:db8::1]"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "unquoted_v6_port", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=[2001:db8::1]:4711"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "unquoted_v4_port", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=192.0.2.1:8080"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "unquoted_obfuscated_port", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=_hidden:_p"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "unquoted_bare_v6", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=2001:db8::1"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "unquoted_host_port", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=203.0.113.7;host=example.com:8080"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "unquoted_non_token_left_of_client", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=[2001:db8::1], for=203.0.113.7"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "quoted_v6_zone", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="[fe80::1%eth0]"`}, wantErr: keyreason.ErrInvalidHeader},
		{name: "space_before_equals", peer: "10.0.0.1:80", headers: []string{"Forwarded: for =203.0.113.7"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "space_after_equals", peer: "10.0.0.1:80", headers: []string{"Forwarded: for= 203.0.113.7"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "empty_value", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=;proto=http"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "empty_quoted_for", peer: "10.0.0.1:80", headers: []string{`Forwarded: for=""`}, wantErr: keyreason.ErrInvalidHeader},
		{name: "stray_quote_after_token", peer: "10.0.0.1:80", headers: []string{`Forwarded: for=203.0.113.7"`}, wantErr: keyreason.ErrInvalidHeader},
		{name: "text_after_quoted", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="203.0.113.7"x`}, wantErr: keyreason.ErrInvalidHeader},
		{name: "duplicate_proto", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=203.0.113.7;proto=http;PROTO=https"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "quoted_obs_text", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=203.0.113.7;host=\"caf\xc3\xa9\""}, want: "203.0.113.7"},
		{name: "unquoted_obs_text", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=203.0.113.7;host=caf\xc3\xa9"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "quoted_pair_of_ctl", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=203.0.113.7;host=\"a\\\x01\""}, wantErr: keyreason.ErrInvalidHeader},
		{name: "quoted_del", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=203.0.113.7;host=\"a\x7f\""}, wantErr: keyreason.ErrInvalidHeader},
		{name: "name_not_token", peer: "10.0.0.1:80", headers: []string{"Forwarded: f(r)=1;for=203.0.113.7"}, wantErr: keyreason.ErrInvalidHeader},
		// A client that leaves a quote open swallows the element its proxy appends on the
		// same line: the line no longer parses, and the client gets no identity at all.
		{name: "open_quote_swallows_proxy_element", peer: "10.0.0.1:80", headers: []string{`Forwarded: for=6.6.6.6;x=", for=203.0.113.7`}, wantErr: keyreason.ErrInvalidHeader},
		{name: "open_quote_meets_proxy_quote", peer: "10.0.0.1:80", headers: []string{`Forwarded: for=6.6.6.6;x=", for="[2001:db8:1::7]:4711"`}, wantErr: keyreason.ErrInvalidHeader},
		{name: "quote_does_not_span_lines", peer: "10.0.0.1:80", headers: []string{`Forwarded: for=6.6.6.6;x="`, `Forwarded: ", for=203.0.113.7`}, wantErr: keyreason.ErrInvalidHeader},
		{name: "garbage_address", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=bogus"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "v4_in_brackets", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="[203.0.113.7]"`}, wantErr: keyreason.ErrInvalidHeader},
		{name: "unterminated_quote", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="203.0.113.7`}, wantErr: keyreason.ErrInvalidHeader},
		{name: "duplicate_for", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=203.0.113.7;for=10.0.0.3"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "missing_equals", peer: "10.0.0.1:80", headers: []string{"Forwarded: for"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "bad_port", peer: "10.0.0.1:80", headers: []string{`Forwarded: for="203.0.113.7:123456"`}, wantErr: keyreason.ErrInvalidHeader},
		{name: "too_many_hops", peer: "10.0.0.1:80", headers: []string{"Forwarded: " + strings.Repeat("for=10.0.0.2, ", 70) + "for=203.0.113.7"}, wantErr: keyreason.ErrInvalidHeader},
	})
}

func TestClientIP_SingleAddressHeader(t *testing.T) {
	t.Parallel()
	fn := mustClientIP(t, keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader("x-real-ip"))
	runIP(t, fn, []ipCase{
		{name: "trusted_peer", peer: "10.0.0.1:80", headers: []string{"X-Real-IP: 203.0.113.7"}, want: "203.0.113.7"},
		{name: "untrusted_peer_ignored", peer: "198.51.100.1:80", headers: []string{"X-Real-IP: 203.0.113.7"}, want: "198.51.100.1"},
		{name: "last_value_wins", peer: "10.0.0.1:80", headers: []string{"X-Real-IP: 1.1.1.1", "X-Real-IP: 203.0.113.7"}, want: "203.0.113.7"},
		{name: "garbage_no_fallback", peer: "10.0.0.1:80", headers: []string{"X-Real-IP: 1.1.1.1", "X-Real-IP: bogus"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "list_is_garbage", peer: "10.0.0.1:80", headers: []string{"X-Real-IP: 203.0.113.7, 1.1.1.1"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "mapped", peer: "10.0.0.1:80", headers: []string{"X-Real-IP: ::ffff:203.0.113.7"}, want: "203.0.113.7"},
		{name: "ipv6", peer: "10.0.0.1:80", headers: []string{"X-Real-IP: 2001:db8:1:2::3"}, want: "2001:db8:1:2::/64"},
		{name: "missing_is_peer", peer: "10.0.0.1:80", want: "10.0.0.1"},
		{name: "xff_ignored", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: 203.0.113.7"}, want: "10.0.0.1"},
	})
}

// The name given to FromHeader is matched in its canonical form: any spelling of
// X-Forwarded-For or Forwarded reads that header's chain, not a single address.
func TestClientIP_FromHeaderNameCase(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"x-forwarded-for", "X-FORWARDED-FOR"} {
		runIP(t, mustClientIP(t, keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader(name)), []ipCase{
			{name: name + "/chain", peer: "10.0.0.1:80", headers: []string{"X-Forwarded-For: 6.6.6.6, 203.0.113.7, 10.0.0.2"}, want: "203.0.113.7"},
		})
	}
	for _, name := range []string{"forwarded", "FORWARDED"} {
		runIP(t, mustClientIP(t, keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader(name)), []ipCase{
			{name: name + "/chain", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=6.6.6.6, for=203.0.113.7, for=10.0.0.2"}, want: "203.0.113.7"},
			{name: name + "/unknown_hop", peer: "10.0.0.1:80", headers: []string{"Forwarded: for=unknown"}, wantErr: keyreason.ErrNoClientIP},
		})
	}
}

func TestClientIP_ChiClientIP(t *testing.T) {
	t.Parallel()
	fn := mustClientIP(t, keyfuncs.ChiClientIP(), keyfuncs.Prefixes(32, 56))
	var got string
	var gotErr error
	h := middleware.ClientIPFromXFF("10.0.0.0/8")(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, gotErr = fn(r)
	}))
	tt := []struct {
		name, peer, xff, want string
		wantErr               error
	}{
		{name: "ipv4", peer: "10.0.0.1:80", xff: "203.0.113.7", want: "203.0.113.7"},
		{name: "ipv6_grouped", peer: "10.0.0.1:80", xff: "2001:db8:1:2ff::1", want: "2001:db8:1:200::/56"},
		{name: "untrusted_peer", peer: "198.51.100.1:80", xff: "203.0.113.7", want: "198.51.100.1"},
		{name: "garbage_no_ip", peer: "10.0.0.1:80", xff: "bogus", wantErr: keyreason.ErrNoClientIP},
	}
	for _, tc := range tt {
		got, gotErr = "", nil
		h.ServeHTTP(httptest.NewRecorder(), req(tc.peer, "X-Forwarded-For: "+tc.xff))
		if tc.wantErr != nil {
			if !errors.Is(gotErr, tc.wantErr) {
				t.Errorf("%s: got (%q, %v), want %v", tc.name, got, gotErr, tc.wantErr)
			}
			continue
		}
		if gotErr != nil || got != tc.want {
			t.Errorf("%s: got (%q, %v), want %q", tc.name, got, gotErr, tc.want)
		}
	}
	// Without the chi middleware there is no address, and no fallback to the peer.
	if got, err := fn(req("203.0.113.7:1")); !errors.Is(err, keyreason.ErrNoClientIP) {
		t.Errorf("without middleware: got (%q, %v), want ErrNoClientIP", got, err)
	}
}

func TestClientIP_IPv6Grouping(t *testing.T) {
	t.Parallel()
	key := func(fn keyFunc, peer string) string {
		t.Helper()
		k, err := fn(req(peer))
		if err != nil {
			t.Fatalf("%s: %v", peer, err)
		}
		return k
	}
	def := mustClientIP(t)
	a := key(def, "[2001:db8:1:2::1]:1")
	b := key(def, "[2001:db8:1:2:ffff:ffff:ffff:ffff]:1")
	c := key(def, "[2001:db8:1:3::1]:1")
	if a != b {
		t.Errorf("same /64: %q != %q", a, b)
	}
	if a == c {
		t.Errorf("different /64 share key %q", a)
	}
	if want := "2001:db8:1:2::/64"; a != want {
		t.Errorf("got %q, want %q", a, want)
	}

	p56 := mustClientIP(t, keyfuncs.Prefixes(32, 56))
	if x, y := key(p56, "[2001:db8:1:2::1]:1"), key(p56, "[2001:db8:1:ff::1]:1"); x != y || x != "2001:db8:1::/56" {
		t.Errorf("/56: got %q and %q, want both 2001:db8:1::/56", x, y)
	}
	if x, y := key(p56, "[2001:db8:1:2::1]:1"), key(p56, "[2001:db8:1:100::1]:1"); x == y {
		t.Errorf("/56: different /56 share key %q", x)
	}
	full := mustClientIP(t, keyfuncs.Prefixes(24, 128))
	if got := key(full, "[2001:db8::1]:1"); got != "2001:db8::1" {
		t.Errorf("/128: got %q", got)
	}
	if got := key(full, "203.0.113.7:1"); got != "203.0.113.0/24" {
		t.Errorf("v4 /24: got %q", got)
	}
}

func TestClientIP_Config(t *testing.T) {
	t.Parallel()
	tt := []struct {
		name string
		opts []keyfuncs.IPOption
		want string // substring of the error; "" for success
	}{
		{name: "default", opts: nil},
		{name: "bad_cidr", opts: []keyfuncs.IPOption{keyfuncs.TrustedProxies("10.0.0.0/33"), keyfuncs.FromHeader("X-Forwarded-For")}, want: "TrustedProxies"},
		{name: "bad_addr", opts: []keyfuncs.IPOption{keyfuncs.TrustedProxies("nope"), keyfuncs.FromHeader("X-Forwarded-For")}, want: "TrustedProxies"},
		{name: "single_addr_ok", opts: []keyfuncs.IPOption{keyfuncs.TrustedProxies("192.0.2.1", "::1"), keyfuncs.FromHeader("X-Forwarded-For")}},
		{name: "slash_zero", opts: []keyfuncs.IPOption{keyfuncs.TrustedProxies("0.0.0.0/0"), keyfuncs.FromHeader("X-Forwarded-For")}, want: "TrustedProxies"},
		{name: "mapped_prefix", opts: []keyfuncs.IPOption{keyfuncs.TrustedProxies("::ffff:10.0.0.0/104"), keyfuncs.FromHeader("X-Forwarded-For")}, want: "TrustedProxies"},
		{name: "empty_trusted", opts: []keyfuncs.IPOption{keyfuncs.TrustedProxies(), keyfuncs.FromHeader("X-Forwarded-For")}, want: "TrustedProxies"},
		{name: "xff_without_trust", opts: []keyfuncs.IPOption{keyfuncs.FromHeader("X-Forwarded-For")}, want: `FromHeader("X-Forwarded-For") requires TrustedProxies`},
		{name: "forwarded_without_trust", opts: []keyfuncs.IPOption{keyfuncs.FromHeader("Forwarded")}, want: `FromHeader("Forwarded") requires TrustedProxies`},
		{name: "header_without_trust", opts: []keyfuncs.IPOption{keyfuncs.FromHeader("X-Real-IP")}, want: `FromHeader("X-Real-Ip") requires TrustedProxies`},
		{name: "trust_without_source", opts: []keyfuncs.IPOption{keyfuncs.TrustedProxies("10.0.0.0/8")}, want: "TrustedProxies has no effect"},
		{name: "two_sources", opts: []keyfuncs.IPOption{keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader("X-Forwarded-For"), keyfuncs.FromHeader("Forwarded")}, want: "choose one"},
		{name: "two_headers_named", opts: []keyfuncs.IPOption{keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader("X-Real-IP"), keyfuncs.FromHeader("x-real-ip")}, want: `FromHeader("X-Real-Ip") and FromHeader("X-Real-Ip") both choose`},
		{name: "header_and_chi", opts: []keyfuncs.IPOption{keyfuncs.FromHeader("X-Forwarded-For"), keyfuncs.ChiClientIP()}, want: `FromHeader("X-Forwarded-For") and ChiClientIP both choose`},
		{name: "header_name_colon", opts: []keyfuncs.IPOption{keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader("X-Real-IP:")}, want: "FromHeader: invalid header name"},
		{name: "chi_with_trust", opts: []keyfuncs.IPOption{keyfuncs.ChiClientIP(), keyfuncs.TrustedProxies("10.0.0.0/8")}, want: "ChiClientIP"},
		{name: "bad_header_name", opts: []keyfuncs.IPOption{keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader("")}, want: "FromHeader"},
		{name: "v6_prefix_range", opts: []keyfuncs.IPOption{keyfuncs.Prefixes(32, 0)}, want: "Prefixes: ipv6: 0 bits"},
		{name: "v4_prefix_range", opts: []keyfuncs.IPOption{keyfuncs.Prefixes(33, 64)}, want: "Prefixes: ipv4: 33 bits"},
		{name: "require_without_source", opts: []keyfuncs.IPOption{keyfuncs.RequireForwarding()}, want: "RequireForwarding"},
		{name: "nil_option", opts: []keyfuncs.IPOption{nil}, want: "nil option"},
	}
	for _, tc := range tt {
		t.Run(tc.name, func(t *testing.T) {
			fn, err := keyfuncs.ClientIP(tc.opts...)
			if tc.want == "" {
				if err != nil || fn == nil {
					t.Fatalf("got error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
