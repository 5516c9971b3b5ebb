// Package keyfuncs maps each request to the two halves of a budget's key: an identity
// (whose budget: a client IP prefix, an account, nobody) and a scope (where it applies:
// a route pattern). Its key functions are plain func(*http.Request) (string, error), the
// shape of middleware.Rule's Identity and Scope and of httprate's KeyFunc, so extractors
// written for one work with the other.
//
//	clientIP, err := keyfuncs.ClientIP(
//		keyfuncs.TrustedProxies("10.0.0.0/8"), // the load balancers' subnet
//		keyfuncs.FromHeader("X-Forwarded-For"),
//	)
//	if err != nil {
//		log.Fatal(err) // names the option at fault
//	}
//	scope := keyfuncs.RoutePattern()
//
// Every key function returns a non-empty key or an error. An error is not a budget: the
// middleware turns it into a documented response (400 by default, naming the reason
// when it knows one: this package's errors have theirs, "header X-Api-Key is missing or
// empty"; a function of your own returns a *middleware.InputError with a Reason), never
// into one bucket shared by everyone whose key failed.
// The middleware refuses an empty key from any key function the same way; a service-wide
// budget is asked for with [Global].
//
// # Threat model
//
// Anyone can send any header. A rate limit keyed on a value the client chooses is no
// limit: the client rotates it to get fresh budgets, or pins it to a victim's value to
// exhaust the victim's budget. So:
//
//   - By default the client is the TCP peer (r.RemoteAddr). It cannot be spoofed over TCP,
//     but behind a proxy it is the proxy, and all clients share its budget. A middleware
//     that rewrites r.RemoteAddr from headers first (chi's middleware.RealIP) hands the
//     choice back to the client: use [TrustedProxies] or [ChiClientIP] instead.
//   - A forwarding header (X-Forwarded-For, Forwarded, X-Real-IP, CF-Connecting-IP, ...)
//     is read only when the TCP peer is one of the [TrustedProxies]. From any other peer
//     it is ignored entirely and the peer is the client: a client reaching the server
//     directly gains nothing by sending one.
//   - Chains are walked from the right, the end written by your own proxies. Each trusted
//     hop vouches for the entry before it; the first address that is not trusted is the
//     client. Entries left of it were written by the client (or by proxies you do not
//     trust) and are never read, so prepending fake entries changes nothing.
//   - Garbage met before the client is found is an error (400, "header X-Forwarded-For
//     is malformed"); in Forwarded, whose quoting decides where elements end, garbage
//     anywhere is. A hop hidden as "unknown" or "_obfuscated" is an error too (400, "the
//     client address could not be determined"). Neither falls back to a proxy's
//     address, which would merge many clients into one budget.
//   - IPv4-mapped IPv6 (::ffff:192.0.2.1) is read as IPv4 and IPv6 zones are dropped
//     before any check, so no notation aliases a trusted or another address.
//   - IPv6 clients are grouped by prefix (/64 by default, see [Prefixes]): one
//     subscriber holds at least a /64, often a /56 or a /48.
//   - Keys are bounded and collision-free: [Header] refuses values longer than 256 bytes
//     or outside printable ASCII; [Func] hashes them; [Join] length-prefixes its parts
//     and hashes joins longer than 512 bytes. Every digest is 65 bytes ("~" and 64 hex
//     digits). No key built from request data contains '{' or '}', so none can choose a
//     Redis Cluster slot. Secrets are hashed ([HashedHeader], [Hash]) before they become
//     keys.
//   - A secret is one identity however it is spelled: [HashedHeader] reads Authorization
//     as credentials (the scheme in any case, any whitespace, base64 decoders read
//     alike) and refuses a header sent on several lines that differ, so a client
//     cannot multiply its budget by respelling its key or adding a line.
//
// # Recipes
//
// Behind proxies, [TrustedProxies] names them and [FromHeader] names the one header they
// write. The name decides how it is read: "X-Forwarded-For" and "Forwarded" (RFC 7239)
// as chains walked from the right, any other name as a single address.
//
// A load balancer or reverse proxy that appends the peer it saw to X-Forwarded-For
// (nginx with proxy_add_x_forwarded_for, AWS ALB, HAProxy option forwardfor): trust its
// subnet.
//
//	keyfuncs.ClientIP(keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader("X-Forwarded-For"))
//
// A CDN directly in front of the server, which overwrites a single-address header: trust
// the CDN's published ranges and name its header. Make sure the origin accepts traffic
// only from those ranges, or at least that the header is ignored otherwise (it is).
//
//	keyfuncs.ClientIP(
//		keyfuncs.TrustedProxies("173.245.48.0/20", "2400:cb00::/32"), // see cloudflare.com/ips
//		keyfuncs.FromHeader("CF-Connecting-IP"),
//	)
//
// A CDN in front of a load balancer (CDN → LB → app): the server's peer is the LB, so a
// single-address header would be believed whoever reached the LB, including a client
// that bypasses the CDN. Use X-Forwarded-For and trust both: the LB appends the CDN edge's
// address (trusted) and the CDN appends the client's (not trusted), so the client is
// found; a client that reaches the LB directly is its own rightmost untrusted entry.
//
//	keyfuncs.ClientIP(
//		keyfuncs.TrustedProxies(
//			"10.0.0.0/8",                           // the load balancers
//			"173.245.48.0/20", "2400:cb00::/32", // the CDN's edges
//		),
//		keyfuncs.FromHeader("X-Forwarded-For"),
//	)
//
// Proxies that speak RFC 7239 write Forwarded: name it, FromHeader("Forwarded"), and its
// "for" chain is walked as X-Forwarded-For's is. Applications that already run chi's
// middleware.ClientIPFromXFF (or another ClientIPFrom*) can reuse its decision with
// [ChiClientIP].
//
// # Scopes
//
// [RoutePattern] scopes a budget to the route that matched ("/users/{id}", not
// "/users/42"); joined with the method, to each method of it (see [RoutePattern]). On a
// chi router it works wherever the middleware is mounted, but in the r.Use of a
// subrouter (r.Route, r.Mount) the pattern is the mount's ("/api/*", one scope for the
// subtree: use r.With or r.Group there); with an http.ServeMux, wrap the handler given
// to mux.Handle, not the mux (around a mux no route is known yet: 500 and one log line).
// There is no scope by the raw URL path, httprate's KeyByEndpoint: a budget per distinct
// URL is state without bound, chosen by the client, who also gets a fresh budget by
// varying the path. Code ported from httprate uses [RoutePattern]; where the raw path
// must stay, Func(func(r *http.Request) (string, error) { return r.URL.Path, nil }) is
// KeyByEndpoint's key, each key bounded (long or unusual paths are hashed, see [Func])
// but not their number.
package keyfuncs
