package keyfuncs_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ratebudget/ratebudget/keyfuncs"
)

var sink string

func benchKey(b *testing.B, fn keyFunc, r *http.Request) {
	b.Helper()
	b.ReportAllocs()
	for b.Loop() {
		k, err := fn(r)
		if err != nil {
			b.Fatal(err)
		}
		sink = k
	}
}

// BenchmarkClientIP measures one key extraction. An IPv4 key must stay at 0 allocs/op,
// from RemoteAddr or from a forwarding header (the key reuses the address's text); an
// IPv6 prefix costs its string (1 alloc). Walking a header allocates nothing.
func BenchmarkClientIP(b *testing.B) {
	remote := mustClientIP(b)
	xff := mustClientIP(b, keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader("X-Forwarded-For"))
	fwd := mustClientIP(b, keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader("Forwarded"))

	b.Run("remote_addr_ipv4", func(b *testing.B) {
		benchKey(b, remote, req("203.0.113.7:41000"))
	})
	b.Run("remote_addr_ipv6_64", func(b *testing.B) {
		benchKey(b, remote, req("[2001:db8:1:2:3:4:5:6]:41000"))
	})
	b.Run("xff_hops=3", func(b *testing.B) {
		benchKey(b, xff, req("10.0.0.1:80", "X-Forwarded-For: 6.6.6.6, 203.0.113.7, 10.1.1.1, 10.2.2.2"))
	})
	b.Run("xff_ipv6_64", func(b *testing.B) {
		benchKey(b, xff, req("10.0.0.1:80", "X-Forwarded-For: 2001:db8:1:2::7, 10.2.2.2"))
	})
	b.Run("forwarded_hops=3", func(b *testing.B) {
		benchKey(b, fwd, req("10.0.0.1:80", `Forwarded: for=6.6.6.6, for="203.0.113.7:4711";proto=https, for=10.1.1.1`))
	})
}

// BenchmarkJoin bounds the cost of a composite identity (tenant + client IP).
func BenchmarkJoin(b *testing.B) {
	ip := mustClientIP(b)
	fn := keyfuncs.Join(keyfuncs.Header("X-Tenant"), ip)
	r := req("203.0.113.7:41000", "X-Tenant: acme")
	benchKey(b, fn, r)
}

// BenchmarkRoutePattern measures the scope lookup at a chi-like endpoint (ServeMux here).
func BenchmarkRoutePattern(b *testing.B) {
	r := httptest.NewRequest(http.MethodGet, "/users/1", nil)
	r.Pattern = "GET /users/{id}"
	benchKey(b, keyfuncs.RoutePattern(), r)
}

// BenchmarkHashedHeader bounds the cost of keying by a secret (HMAC-SHA-256).
func BenchmarkHashedHeader(b *testing.B) {
	fn := keyfuncs.HashedHeader("X-API-Key", []byte("0123456789abcdef"))
	benchKey(b, fn, req("203.0.113.7:1", "X-API-Key: sk_live_0123456789abcdef"))
}

// BenchmarkHashedHeaderAuthorization measures keying by a bearer JWT (about 200 bytes),
// read as credentials: written canonically, as clients do, it is hashed as sent.
func BenchmarkHashedHeaderAuthorization(b *testing.B) {
	fn := keyfuncs.HashedHeader("Authorization", []byte("0123456789abcdef"))
	jwt := "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." +
		"eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ." +
		"SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
	benchKey(b, fn, req("203.0.113.7:1", "Authorization: Bearer "+jwt))
}
