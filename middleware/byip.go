package middleware

import (
	"net/http"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/keyfuncs"
)

// LimitByIP returns middleware admitting limit requests per window per client address,
// on lim: the common case in one call, like httprate.LimitByIP. The rule is a fixed
// window named "per-ip"; the client is the TCP peer (r.RemoteAddr), IPv6 grouped by /64
// (keyfuncs.ClientIP() without options; a middleware in front of it that rewrites
// r.RemoteAddr from headers, such as chi's middleware.RealIP, lets every client choose
// its address and its budget). Behind a proxy or load balancer every client
// would share the proxy's budget: build the rule with [New] and keyfuncs.ClientIP's
// TrustedProxies instead. opts are [New]'s options.
//
// Every LimitByIP middleware names its rule "per-ip", and a rule's name is its budget:
// on one limiter, LimitByIP middlewares on different routes spend from one budget per
// client (each checks it against its own limit), and two stacked on one request (a
// group's r.Use and a route's r.With) are refused by the limiter, so the route answers
// 500. For a second per-IP limit, build it with [New] and a rule of its own name.
func LimitByIP(lim ratebudget.Limiter, limit int64, window time.Duration, opts ...Option) (func(http.Handler) http.Handler, error) {
	ip, err := keyfuncs.ClientIP()
	if err != nil {
		return nil, err
	}
	return New(lim, []Rule{{
		Rule:     ratebudget.Rule{Name: "per-ip", Limit: limit, Window: window},
		Identity: ip,
	}}, opts...)
}
