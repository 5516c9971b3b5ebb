package middleware

import (
	"net/http"
	"strconv"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/keyfuncs"
)

// LimitByIP returns middleware admitting limit requests per window per client address,
// on lim: the common case in one call, like httprate.LimitByIP. The rule is a fixed
// window named for its limit and window, "per-ip-100-60s" for 100 per minute (the
// window in whole seconds, else in ms: "per-ip-5-1500ms"); the client is the TCP peer (r.RemoteAddr), IPv6 grouped by /64
// (keyfuncs.ClientIP() without options; a middleware in front of it that rewrites
// r.RemoteAddr from headers, such as chi's middleware.RealIP, lets every client choose
// its address and its budget). Behind a proxy or load balancer every client
// would share the proxy's budget: build the rule with [New] and keyfuncs.ClientIP's
// TrustedProxies instead. opts are [New]'s options.
//
// A rule's name is its budget: on one limiter, LimitByIP middlewares of the same limit
// and window spend from one budget per client wherever they are mounted, and two of
// them stacked on one request (in r.Use and a route's r.With) spend it once; of
// different limits or windows, such as a global limit in r.Use and a stricter one in a
// route's r.With, they are budgets of their own, each enforced.
func LimitByIP(lim ratebudget.Limiter, limit int64, window time.Duration, opts ...Option) (func(http.Handler) http.Handler, error) {
	ip, err := keyfuncs.ClientIP()
	if err != nil {
		return nil, err
	}
	return New(lim, []Rule{{
		Rule:     ratebudget.Rule{Name: byIPName(limit, window), Limit: limit, Window: window},
		Identity: ip,
	}}, opts...)
}

// byIPName names LimitByIP's rule for its limit and window.
func byIPName(limit int64, window time.Duration) string {
	if window%time.Second == 0 {
		return "per-ip-" + strconv.FormatInt(limit, 10) + "-" + strconv.FormatInt(int64(window/time.Second), 10) + "s"
	}
	return "per-ip-" + strconv.FormatInt(limit, 10) + "-" + strconv.FormatInt(window.Milliseconds(), 10) + "ms"
}
