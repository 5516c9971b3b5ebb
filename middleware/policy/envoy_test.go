package policy

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

// request is a GET of path from addr with the headers given as name, value pairs.
func request(addr, path string, headers ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.RemoteAddr = addr
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	return r
}

// decided lists the rules that apply to r under p, as "name limit/window" with the
// plan after @ when there is one, "shadow" and "unlimited" when they hold.
func decided(p *Policy, r *http.Request) []string {
	var out []string
	for _, a := range p.resolve(r, nil) {
		s := fmt.Sprintf("%s %d/%v", a.rule, a.Limit, a.Window)
		if a.Window == 0 {
			s = fmt.Sprintf("%s %d", a.rule, a.Limit)
		}
		if a.plan != "" {
			s += " @" + a.plan
		}
		if a.Unlimited {
			s = a.rule + " unlimited"
		}
		if a.Shadow {
			s += " shadow"
		}
		out = append(out, s)
	}
	return out
}

// TestEnvoyExamples holds the precedence examples of envoy ratelimit's README, written
// in this format (testdata/envoy-*.yaml, each citing its example), to the decisions
// the README documents: which rules apply to a request, with which limits.
func TestEnvoyExamples(t *testing.T) {
	const ip = "192.0.2.1:1234"
	tt := []struct {
		file string
		name string
		req  *http.Request
		want []string
	}{
		// Example 1: each value its own limit; a value not listed matches nothing.
		{"envoy-1.yaml", "users", request(ip, "/", "database", "users"), []string{"database_users 500/1s"}},
		{"envoy-1.yaml", "default", request(ip, "/", "database", "default"), []string{"database_default 500/1s"}},
		{"envoy-1.yaml", "other", request(ip, "/", "database", "orders"), nil},
		// Example 2: a marketing message to a number is decided under both rules, any
		// other message to a number under the per-number rule only.
		{"envoy-2-nested.yaml", "marketing", request(ip, "/", "message_type", "marketing", "to_number", "2061111111"),
			[]string{"marketing_per_number 5", "per_number 100"}},
		{"envoy-2-nested.yaml", "other_type", request(ip, "/", "message_type", "alert", "to_number", "2061111111"),
			[]string{"per_number 100"}},
		// Example 3: the specific address gets its own rule and not the general one.
		{"envoy-3-specific.yaml", "any_ip", request("50.0.0.1:4000", "/"), []string{"per_ip 10/1s"}},
		{"envoy-3-specific.yaml", "listed_ip", request("50.0.0.5:4000", "/"), []string{"listed_ip 1/1s"}},
		{"envoy-3-specific.yaml", "listed_ip_v4_in_v6", request("[::ffff:50.0.0.5]:4000", "/"), []string{"listed_ip 1/1s"}},
		// Example 5: unlimited, decided without the store; azure limited.
		{"envoy-5-unlimited.yaml", "ldap", request(ip, "/", "ldap", "x"), []string{"ldap unlimited"}},
		{"envoy-5-unlimited.yaml", "azure", request(ip, "/", "azure", "x"), []string{"azure 100/1m0s"}},
		{"envoy-5-unlimited.yaml", "neither", request(ip, "/"), nil},
		// Example 6: user-a in shadow mode, user-b enforced; the service must be given.
		{"envoy-6-shadow.yaml", "user_a", request(ip, "/", "service", "auth-service", "user", "user-a"), []string{"service_user_a 10/1s shadow"}},
		{"envoy-6-shadow.yaml", "user_b", request(ip, "/", "service", "auth-service", "user", "user-b"), []string{"service_user_b 20/1s"}},
		{"envoy-6-shadow.yaml", "no_service", request(ip, "/", "user", "user-b"), nil},
		// Example 7: the replacing rule alone when both match.
		{"envoy-7-replaces.yaml", "key_1", request(ip, "/", "key_1", "value_1", "user", "bkthomps"), []string{"specific_limit 5/1s"}},
		{"envoy-7-replaces.yaml", "key_2", request(ip, "/", "key_2", "value_2", "user", "bkthomps"), []string{"key_2_user 10/1s"}},
		{"envoy-7-replaces.yaml", "both", request(ip, "/", "key_1", "value_1", "key_2", "value_2", "user", "bkthomps"), []string{"key_2_user 10/1s"}},
		{"envoy-7-replaces.yaml", "other_user", request(ip, "/", "key_1", "value_1", "key_2", "value_2", "user", "someone"), nil},
		// Example 9: a value ending in * is a prefix.
		{"envoy-9-wildcard.yaml", "value_1", request(ip, "/", "key1", "value_1"), []string{"key1_values 20/1m0s"}},
		{"envoy-9-wildcard.yaml", "value_2", request(ip, "/", "key1", "value_2"), []string{"key1_values 20/1m0s"}},
		{"envoy-9-wildcard.yaml", "other", request(ip, "/", "key1", "other"), nil},
		// Global shadow mode: every rule shadowed.
		{"envoy-global-shadow.yaml", "any", request(ip, "/"), []string{"per_ip 10/1s shadow"}},
	}
	for _, tc := range tt {
		t.Run(tc.file+"/"+tc.name, func(t *testing.T) {
			p, err := Load("testdata/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			if got := decided(p, tc.req); !slices.Equal(got, tc.want) {
				t.Errorf("decided %q, want %q", got, tc.want)
			}
		})
	}
}

// TestPlansAndOverrides holds the example's tenants to their plans: a listed key on its
// plan, an unknown or missing key on the default plan, an override over its plan, and
// a rule the plan makes unlimited.
func TestPlansAndOverrides(t *testing.T) {
	p, err := Load("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const ip = "192.0.2.1:1234"
	tt := []struct {
		name string
		req  *http.Request
		want []string
	}{
		{"free", request(ip, "/api/hello", "X-API-Key", "demo-free"),
			[]string{"per-ip 100/1m0s @free", "hello 5/1m0s @free", "daily 50 @free"}},
		{"pro", request(ip, "/api/hello", "X-API-Key", "demo-pro"),
			[]string{"per-ip 100/1m0s @pro", "hello 100/1m0s @pro", "daily unlimited"}},
		{"override", request(ip, "/api/hello", "X-API-Key", "demo-acme"),
			[]string{"per-ip 100/1m0s @pro.acme", "hello 500/1m0s @pro.acme", "daily unlimited"}},
		{"unknown_key", request(ip, "/api/hello", "X-API-Key", "who"),
			[]string{"per-ip 100/1m0s @free", "hello 5/1m0s @free", "daily 50 @free"}},
		{"no_key", request(ip, "/api/other"),
			[]string{"per-ip 100/1m0s @free", "daily 50 @free"}},
		{"other_path", request(ip, "/", "X-API-Key", "demo-pro"),
			[]string{"per-ip 100/1m0s @pro"}},
		{"head", func() *http.Request {
			r := request(ip, "/api/hello", "X-API-Key", "demo-free")
			r.Method = http.MethodHead
			return r
		}(),
			[]string{"per-ip 100/1m0s @free", "hello 5/1m0s @free", "daily 50 @free"}},
		{"post", func() *http.Request {
			r := request(ip, "/api/hello", "X-API-Key", "demo-free")
			r.Method = http.MethodPost
			return r
		}(),
			[]string{"per-ip 100/1m0s @free", "daily 50 @free"}},
	}
	for _, tc := range tt {
		t.Run(tc.name, func(t *testing.T) {
			if got := decided(p, tc.req); !slices.Equal(got, tc.want) {
				t.Errorf("decided %q, want %q", got, tc.want)
			}
		})
	}
}

// TestResolveAllocs pins the precedence engine at no allocation per request.
func TestResolveAllocs(t *testing.T) {
	p, err := Load("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := request("192.0.2.1:1234", "/api/hello", "X-API-Key", "demo-acme")
	buf := make([]applied, 0, 8)
	if n := testing.AllocsPerRun(100, func() { buf = p.resolve(r, buf[:0]) }); n != 0 {
		t.Errorf("resolve allocates %v times per request, want 0", n)
	}
}

// BenchmarkResolve measures the precedence engine for one request: the example's
// three rules, a tenant on an override, among 10,000 listed tenants.
func BenchmarkResolve(b *testing.B) {
	src := []byte(exampleWithTenants(10000))
	p, err := Parse("bench.yaml", src)
	if err != nil {
		b.Fatal(err)
	}
	r := request("192.0.2.1:1234", "/api/hello", "X-API-Key", "tenant-5000")
	buf := make([]applied, 0, 8)
	b.ReportAllocs()
	for b.Loop() {
		buf = p.resolve(r, buf[:0])
	}
	if len(buf) != 3 {
		b.Fatalf("resolved %d rules, want 3", len(buf))
	}
}

// exampleWithTenants is testdata/example.yaml's rules and plans with n tenants listed,
// alternately on free and pro.
func exampleWithTenants(n int) string {
	s := `rules:
  - {name: per-ip, identity: ip, time: {limit: 100, window: 1m}}
  - {name: hello, identity: hashed_header:X-API-Key, match: {method: GET, path: /api/hello}, time: {limit: 5, window: 1m}}
  - {name: daily, identity: hashed_header:X-API-Key, match: {path: /api/*}, time: {type: calendar, limit: 1000, period: day, zone: America/New_York}}
plans:
  free: {hello: {limit: 5}, daily: {limit: 50}}
  pro: {hello: {limit: 100}, daily: {unlimited: true}}
tenants:
  header: X-API-Key
  default: free
  keys:
`
	for i := range n {
		plan := "free"
		if i%2 == 1 {
			plan = "pro"
		}
		s += fmt.Sprintf("    tenant-%d: %s\n", i, plan)
	}
	return s
}
