package keyfuncs_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/go-chi/chi/v5"

	"github.com/ratebudget/ratebudget/keyfuncs"
)

// Behind load balancers in 10.0.0.0/8 that append to X-Forwarded-For, the client is the
// rightmost address that is not a load balancer; clients reaching the server directly
// cannot spoof anything.
func ExampleClientIP() {
	clientIP, err := keyfuncs.ClientIP(
		keyfuncs.TrustedProxies("10.0.0.0/8"),
		keyfuncs.FromHeader("X-Forwarded-For"),
	)
	if err != nil {
		panic(err)
	}
	show := func(peer, xff string) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = peer
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		key, err := clientIP(r)
		fmt.Printf("%-18s %-32q -> %q %v\n", peer, xff, key, err)
	}
	show("10.0.0.1:5000", "203.0.113.7")          // through the LB
	show("10.0.0.1:5000", "6.6.6.6, 203.0.113.7") // spoofed entry on the left
	show("198.51.100.9:5000", "203.0.113.7")      // direct: header ignored
	show("10.0.0.1:5000", "2001:db8:1:2::99")     // IPv6: one key per /64
	show("10.0.0.1:5000", "not-an-ip")            // garbage: refused
	// Output:
	// 10.0.0.1:5000      "203.0.113.7"                    -> "203.0.113.7" <nil>
	// 10.0.0.1:5000      "6.6.6.6, 203.0.113.7"           -> "203.0.113.7" <nil>
	// 198.51.100.9:5000  "203.0.113.7"                    -> "198.51.100.9" <nil>
	// 10.0.0.1:5000      "2001:db8:1:2::99"               -> "2001:db8:1:2::/64" <nil>
	// 10.0.0.1:5000      "not-an-ip"                      -> "" keyfuncs: invalid header: X-Forwarded-For
}

// Join's encoding is unambiguous: parts are length-prefixed, and braces (which would
// choose a Redis Cluster slot) are escaped.
func ExampleJoin_encoding() {
	fixed := func(s string) func(*http.Request) (string, error) {
		return keyfuncs.Func(func(*http.Request) (string, error) { return s, nil })
	}
	r := httptest.NewRequest(http.MethodGet, "/users/42", nil)
	r.Pattern = "GET /users/{id}" // as http.ServeMux sets it
	fmt.Println(keyfuncs.Join(fixed("a:b"), fixed("c"))(r))
	fmt.Println(keyfuncs.Join(fixed("a"), fixed("b:c"))(r))
	fmt.Println(keyfuncs.Join(keyfuncs.RoutePattern())(r))
	// Output:
	// 3:a:b1:c <nil>
	// 1:a3:b:c <nil>
	// 15:/users/%7Bid%7D <nil>
}

// A budget per tenant and client address: Join encodes the parts without ambiguity.
func ExampleJoin() {
	clientIP, _ := keyfuncs.ClientIP()
	key := keyfuncs.Join(keyfuncs.Header("X-Tenant"), clientIP)

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "203.0.113.7:41000"
	r.Header.Set("X-Tenant", "acme")
	fmt.Println(key(r))

	r.Header.Del("X-Tenant")
	fmt.Println(key(r))
	// Output:
	// 4:acme11:203.0.113.7 <nil>
	//  keyfuncs: empty key: X-Tenant
}

// Install a scoped limiter with With (or inside Group): the route is known there. In the
// Use of a subrouter (Route, Mount) only the mount point is, and it is the scope.
func ExampleRoutePattern() {
	scope := keyfuncs.RoutePattern()
	limit := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s, err := scope(r)
			fmt.Printf("scope %q %v\n", s, err)
			next.ServeHTTP(w, r)
		})
	}
	r := chi.NewRouter()
	r.With(limit).Get("/users/{id}", func(http.ResponseWriter, *http.Request) {})
	r.Route("/admin", func(r chi.Router) {
		r.Use(limit) // runs before the subrouter routes: the mount point is the scope
		r.Get("/stats", func(http.ResponseWriter, *http.Request) {})
	})

	r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/users/42", nil))
	r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/admin/stats", nil))
	// Output:
	// scope "/users/{id}" <nil>
	// scope "/admin/*" <nil>
}

// A scope per method of a route: the method joined with the route pattern. HEAD shares
// GET's budget and methods the service does not serve share one, so that a client gets no
// fresh budget by switching to HEAD or by inventing a method.
func ExampleRoutePattern_method() {
	method := keyfuncs.Func(func(r *http.Request) (string, error) {
		switch r.Method {
		case http.MethodHead:
			return http.MethodGet, nil
		case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
			return r.Method, nil
		}
		return "OTHER", nil
	})
	scope := keyfuncs.Join(method, keyfuncs.RoutePattern())

	mux := http.NewServeMux()
	mux.Handle("/users/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println(scope(r))
	}))
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodDelete, "BREW"} {
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(m, "/users/42", nil))
	}
	// Output:
	// 3:GET15:/users/%7Bid%7D <nil>
	// 3:GET15:/users/%7Bid%7D <nil>
	// 6:DELETE15:/users/%7Bid%7D <nil>
	// 5:OTHER15:/users/%7Bid%7D <nil>
}

// API keys are secrets: key the budget by their HMAC, never by the key itself.
func ExampleHashedHeader() {
	byKey := keyfuncs.HashedHeader("X-API-Key", []byte("a secret of at least 16 bytes"))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-API-Key", "sk_live_0123456789")
	key, _ := byKey(r)
	fmt.Println(len(key), key[:1])
	// Output: 65 ~
}
