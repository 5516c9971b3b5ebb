package keyfuncs_test

import (
	"bufio"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ratebudget/ratebudget/internal/keyreason"
	"github.com/ratebudget/ratebudget/keyfuncs"
)

// lastCharVariants returns the spellings of the encoded s that differ from it in the last
// data character (before any padding) and that enc, as the standard library decodes by
// default, reads as the same bytes: the unused low bits of that character are ignored.
// There are none when the decoded length is a multiple of 3.
func lastCharVariants(t *testing.T, enc *base64.Encoding, s string) []string {
	t.Helper()
	want, err := enc.DecodeString(s)
	if err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	data := strings.TrimRight(s, "=")
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_"
	var out []string
	for _, c := range alphabet {
		v := data[:len(data)-1] + string(c) + s[len(data):]
		if v == s {
			continue
		}
		if got, err := enc.DecodeString(v); err == nil && string(got) == string(want) {
			out = append(out, v)
		}
	}
	return out
}

// sameKey asserts that every value of the header gives one identity, and returns it.
func sameKey(t *testing.T, fn keyFunc, name string, values ...string) string {
	t.Helper()
	var first string
	for i, v := range values {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header[name] = []string{v}
		k, err := fn(r)
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		if i == 0 {
			first = k
		} else if k != first {
			t.Errorf("%q and %q are one credential but got different identities", values[0], v)
		}
	}
	return first
}

func keyOf(t *testing.T, fn keyFunc, name string, lines ...string) (string, error) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header[name] = lines
	return fn(r)
}

// TestHashedHeader_BasicSpellings: every spelling of one Basic credential that the
// standard library's r.BasicAuth accepts (any case of the scheme, unused base64 bits),
// and those RFC 9110 allows besides (several spaces after the scheme, whitespace around
// the value), is one identity. Otherwise a client holding one password multiplies its
// budget by the number of spellings.
func TestHashedHeader_BasicSpellings(t *testing.T) {
	t.Parallel()
	fn := keyfuncs.HashedHeader("Authorization", []byte("0123456789abcdef"))
	for _, creds := range []string{"alice:pw", "alice:pw1", "bob:correct horse"} {
		enc := base64.StdEncoding.EncodeToString([]byte(creds))
		spellings := []string{"Basic " + enc, "basic " + enc, "BASIC " + enc, "bAsIc " + enc}
		variants := lastCharVariants(t, base64.StdEncoding, enc)
		if want := len(creds)%3 != 0; (len(variants) > 0) != want {
			t.Fatalf("%q: %d variants", creds, len(variants))
		}
		for _, v := range variants {
			spellings = append(spellings, "Basic "+v, "basic "+v)
		}
		user, pass, _ := strings.Cut(creds, ":")
		for _, s := range spellings { // the oracle: the server reads one credential
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Header.Set("Authorization", s)
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
				t.Fatalf("r.BasicAuth() does not read %q as %q", s, creds)
			}
		}
		spellings = append(spellings, "Basic  "+enc, "Basic \t "+enc, " Basic "+enc+" ", "\tBasic "+enc+"\t")
		if strings.HasSuffix(enc, "=") {
			spellings = append(spellings, "Basic "+strings.TrimRight(enc, "=")) // unpadded
		}
		sameKey(t, fn, "Authorization", spellings...)
	}
	a, _ := keyOf(t, fn, "Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("alice:pw")))
	b, _ := keyOf(t, fn, "Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("alice:pW")))
	if a == b {
		t.Fatal("different passwords share an identity")
	}
}

// TestHashedHeader_BearerSpellings: the scheme is case-insensitive and the whitespace
// after it is any run, but the token is not: its case is significant. A JSON Web Token's
// segments are read as the base64url a JWT library decodes (golang-jwt by default:
// unused bits ignored, padding allowed by an option), so these variants of one signed
// token are one identity too.
func TestHashedHeader_BearerSpellings(t *testing.T) {
	t.Parallel()
	fn := keyfuncs.HashedHeader("Authorization", nil)
	opaque := "mF_9.B5f-4.1JqM"
	k := sameKey(t, fn, "Authorization", "Bearer "+opaque, "bearer "+opaque, "BEARER "+opaque,
		"Bearer   "+opaque, "Bearer\t"+opaque, "  Bearer "+opaque+" \t")
	if other, _ := keyOf(t, fn, "Authorization", "Bearer "+strings.ToLower(opaque)); other == k {
		t.Fatal("tokens differing in case share an identity")
	}
	if other, _ := keyOf(t, fn, "Authorization", "Basic "+opaque); other == k {
		t.Fatal("the scheme is not part of the identity")
	}

	seg := base64.RawURLEncoding.EncodeToString
	sig := seg([]byte("0123456789abcdef0123456789abcdef")) // 32 bytes: 2 unused bits
	jwt := seg([]byte(`{"alg":"HS256"}`)) + "." + seg([]byte(`{"sub":"alice"}`)) + "."
	spellings := []string{"Bearer " + jwt + sig}
	variants := lastCharVariants(t, base64.RawURLEncoding, sig)
	if len(variants) != 3 {
		t.Fatalf("%d variants of a 32-byte signature, want 3", len(variants))
	}
	for _, v := range variants {
		spellings = append(spellings, "Bearer "+jwt+v, "bearer "+jwt+v+"=")
	}
	sameKey(t, fn, "Authorization", spellings...)
	other := seg([]byte("0123456789abcdef0123456789abcdeF"))
	if a, _ := keyOf(t, fn, "Authorization", "Bearer "+jwt+other); a == sameKey(t, fn, "Authorization", spellings[0]) {
		t.Fatal("different signatures share an identity")
	}
}

// TestHashedHeader_CanonicalDigestStable: a credential already written in its canonical
// form (a registered scheme in its registered spelling, one space, the token) keeps the
// digest it had, the digest of the value as sent, so budgets stored under it survive.
func TestHashedHeader_CanonicalDigestStable(t *testing.T) {
	t.Parallel()
	mac := []byte("0123456789abcdef")
	for _, tc := range []struct{ name, value string }{
		{"Authorization", "Bearer mF_9.B5f-4.1JqM"},
		{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:pw"))},
		{"Authorization", "Digest username=\"alice\", realm=\"x\", response=\"abc\""},
		{"Authorization", "Negotiate YIIGhgYJKoZIhvcSAQICAQBuggZ1MIIGcaADAgEF"},
		{"Authorization", "sk_live_no_scheme"},
		{"Proxy-Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("proxy:pw"))},
		{"X-Api-Key", "sk_live_0123456789abcdef"},
	} {
		got, err := keyOf(t, keyfuncs.HashedHeader(tc.name, mac), tc.name, tc.value)
		value := tc.value
		want, _ := keyfuncs.Hash(func(*http.Request) (string, error) { return value, nil }, mac)(nil)
		if err != nil || got != want {
			t.Errorf("%s: %q: got (%q, %v), want %q", tc.name, tc.value, got, err, want)
		}
	}
}

// TestHashedHeader_SeveralLines: a request may carry a header line several times. The
// application authenticates one of them (r.Header.Get reads the first), so an identity
// taken from another line would let a client add a line with a fresh value to every
// request and get a fresh budget each time. Lines that are empty or spell the same
// credential are one identity; lines that disagree are ErrInvalidHeader.
func TestHashedHeader_SeveralLines(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"Authorization", "X-Api-Key"} {
		fn := keyfuncs.HashedHeader(name, nil)
		want, _ := keyOf(t, fn, name, "Bearer valid")
		for _, lines := range [][]string{
			{"Bearer valid", ""},
			{"", "Bearer valid"},
			{"Bearer valid", "  "},
			{"Bearer valid", "Bearer valid"},
		} {
			if got, err := keyOf(t, fn, name, lines...); err != nil || got != want {
				t.Errorf("%s %q: got (%q, %v), want %q", name, lines, got, err, want)
			}
		}
		for _, lines := range [][]string{
			{"Bearer valid", "Bearer fresh-1"},
			{"Bearer fresh-1", "Bearer valid"},
			{"Bearer valid", "", "Bearer valid", "x"},
		} {
			got, err := keyOf(t, fn, name, lines...)
			if !errors.Is(err, keyreason.ErrInvalidHeader) || got != "" {
				t.Errorf("%s %q: got (%q, %v), want ErrInvalidHeader", name, lines, got, err)
			}
			if reason, _ := keyreason.Of(err); reason != "header "+name+" is malformed" {
				t.Errorf("%s %q: reason %q", name, lines, reason)
			}
		}
		if _, err := keyOf(t, fn, name, "", " "); !errors.Is(err, keyreason.ErrEmptyKey) {
			t.Errorf("%s: only empty lines: got %v, want ErrEmptyKey", name, err)
		}
	}
	// Spellings of one credential on two lines are that credential.
	fn := keyfuncs.HashedHeader("Authorization", nil)
	want, _ := keyOf(t, fn, "Authorization", "Bearer valid")
	if got, err := keyOf(t, fn, "Authorization", "Bearer valid", "bearer  valid"); err != nil || got != want {
		t.Errorf("two spellings: got (%q, %v), want %q", got, err, want)
	}
}

// TestHashedHeader_OtherHeaders: a header other than Authorization is a secret as sent,
// except for the whitespace around it (HTTP/1.1 strips it; HTTP/2 hands it over).
func TestHashedHeader_OtherHeaders(t *testing.T) {
	t.Parallel()
	fn := keyfuncs.HashedHeader("X-API-Key", nil)
	k := sameKey(t, fn, "X-Api-Key", "sk_live_A", " sk_live_A", "sk_live_A\t ")
	for _, v := range []string{"sk_live_a", "SK_LIVE_A", "Bearer sk_live_A", "sk_live_A x"} {
		if got, _ := keyOf(t, fn, "X-Api-Key", v); got == k {
			t.Errorf("%q shares the identity of sk_live_A", v)
		}
	}
	a, _ := keyOf(t, fn, "X-Api-Key", "basic  abc")
	b, _ := keyOf(t, fn, "X-Api-Key", "Basic abc")
	if a == b {
		t.Error("only Authorization headers are read as credentials")
	}
}

// TestHashedHeader_OverTheWire: what a client can send to a net/http server. The server
// keeps every Authorization line; the handler authenticates the first.
func TestHashedHeader_OverTheWire(t *testing.T) {
	t.Parallel()
	fn := keyfuncs.HashedHeader("Authorization", nil)
	type result struct {
		key, auth string
		err       error
	}
	results := make(chan result, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, err := fn(r)
		results <- result{k, r.Header.Get("Authorization"), err}
	}))
	defer srv.Close()
	send := func(lines ...string) result {
		t.Helper()
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var b strings.Builder
		b.WriteString("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n")
		for _, l := range lines {
			fmt.Fprintf(&b, "Authorization:%s\r\n", l)
		}
		b.WriteString("\r\n")
		if _, err := c.Write([]byte(b.String())); err != nil {
			t.Fatal(err)
		}
		if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
			t.Fatal(err)
		}
		return <-results
	}
	want := send(" Bearer tok")
	for _, lines := range [][]string{
		{"Bearer tok  "},
		{"\tbearer    tok"},
		{"BEARER tok", ""},
	} {
		if got := send(lines...); got.err != nil || got.key != want.key {
			t.Errorf("%q: got (%q, %v), want %q", lines, got.key, got.err, want.key)
		}
	}
	got := send("Bearer tok", "Bearer fresh")
	if got.auth != "Bearer tok" {
		t.Fatalf("the handler reads %q", got.auth)
	}
	if !errors.Is(got.err, keyreason.ErrInvalidHeader) {
		t.Errorf("an added line: got (%q, %v), want ErrInvalidHeader", got.key, got.err)
	}
}
