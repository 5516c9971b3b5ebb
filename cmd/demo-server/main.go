// Command demo-server is a small HTTP service that shows ratebudget's limits on a chi
// router. It keeps budgets in process by default and in Redis with -redis, where every
// demo-server sharing that Redis shares every budget.
//
//	go run ./cmd/demo-server -limit 3 -window 10s
//	curl -i http://127.0.0.1:8080/api/hello
//
// With -policy FILE the /api routes are limited by the rules of a policy file
// (docs/POLICY.md; cmd/demo-server/policy.yaml) instead of -limit and the other limit
// flags: it is read again when it changes and on SIGHUP, a failed reload is logged and
// counted (ratebudget_policy_reloads_total), and GET / shows the policy in effect.
//
// GET / lists the routes and their limits; HEAD is answered on every GET route and
// spends the same budget. On SIGINT or SIGTERM it stops accepting connections and lets
// running requests finish, for up to 15 s, and exits with status 0; requests still
// running then are cut off (their connections closed) and it exits with status 2. A
// second signal stops it at once. The server's connection limits (-read-header-timeout,
// -read-timeout, -write-timeout, -idle-timeout, -max-header-bytes) default to values
// for a service exposed to untrusted clients; -h lists every flag. A flag value it
// cannot use (an empty -addr or -redis, a -redis port outside 1 to 65535) is refused,
// naming the flag, with status 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
	"github.com/ratebudget/ratebudget/middleware/metrics"
)

func main() {
	// The first SIGINT or SIGTERM ends ctx, and gives the signals back their default
	// action first: a second one stops the process at once, mid-shutdown.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		signal.Stop(sig)
		cancel()
	}()
	os.Exit(exitCode(run(ctx, os.Args[1:], os.Stdout, nil), os.Stderr))
}

// exitCode is the process status for run's error, which it reports on stderr: 0 for
// none and for -h (the usage is on stdout), 2 otherwise.
func exitCode(err error, stderr io.Writer) int {
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		_, _ = io.WriteString(stderr, ue.text) // the flag package's message and the usage
	default:
		fmt.Fprintln(stderr, "demo-server:", err)
	}
	return 2
}

// usageError is a command line the flag set could not parse, with the flag set's
// report of it (the error and the usage).
type usageError struct {
	err  error
	text string
}

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

type options struct {
	addr           string
	limit          int64
	window         time.Duration
	algorithm      ratebudget.Algorithm
	style          headers.Style
	redisURL       string
	storeError     string // -store-error: "closed", "open" or "local"
	replicas       int
	storeTimeout   time.Duration
	trustedProxies []string
	ipv6Prefix     int
	noLimit        bool
	coalesce       int
	oneServer      bool
	maxBudgets     int
	inflight       int64
	leaseTTL       time.Duration
	byteLimit      int64
	shadow         bool
	policy         string // -policy: a policy file; "" for the limits of the flags
	server         serverLimits
}

// serverLimits are the http.Server settings that bound what one connection can hold.
type serverLimits struct {
	readHeaderTimeout time.Duration
	readTimeout       time.Duration
	writeTimeout      time.Duration
	idleTimeout       time.Duration
	maxHeaderBytes    int
}

// The defaults of serverLimits, for a service that faces untrusted clients directly or
// through a load balancer:
//   - the request line and headers within 5 s (a slow-header client holds a connection
//     for no longer);
//   - the whole request, body included, within 10 s: the demo's bodies are a few bytes,
//     and a client that declares 1000 bytes and sends 10 is answered (and disconnected)
//     at the deadline instead of holding a goroutine and a descriptor;
//   - the response within 20 s of the end of the headers, longer than the read deadline
//     so that a slow body still gets its answer;
//   - an idle keep-alive connection is closed after 120 s, longer than the 60 s idle
//     timeout common in load balancers, so that it is the balancer, not the server, that
//     closes a connection it might reuse;
//   - 32 KiB of headers (nginx's default budget; Go's own default is 1 MiB).
const (
	defaultReadHeaderTimeout = 5 * time.Second
	defaultReadTimeout       = 10 * time.Second
	defaultWriteTimeout      = 20 * time.Second
	defaultIdleTimeout       = 120 * time.Second
	defaultMaxHeaderBytes    = 32 << 10
)

// newServer is the demo's http.Server for h.
func newServer(h http.Handler, l serverLimits) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.readHeaderTimeout,
		ReadTimeout:       l.readTimeout,
		WriteTimeout:      l.writeTimeout,
		IdleTimeout:       l.idleTimeout,
		MaxHeaderBytes:    l.maxHeaderBytes,
	}
}

func parseFlags(args []string, out io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("demo-server", flag.ContinueOnError)
	var report strings.Builder // -h goes to out, a parse error's report to stderr
	fs.SetOutput(&report)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: demo-server [flags]\n\nServes ratebudget's demo routes (GET / lists them). Flags:\n\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "listen address, host:port (not empty; :8080 listens on every interface)")
	fs.Int64Var(&o.limit, "limit", 10, "budget per window, in cost units, of /api/hello, /api/jobs and /api/flaky per client IP and of /api/accounts/{id}/report per account (5× for that route as a whole); /api/slow has -inflight, /api/download -byte-limit")
	fs.DurationVar(&o.window, "window", time.Minute, "window, or token-bucket refill period")
	algo := fs.String("algorithm", "fixed", "time rule of the rate limits: fixed | token | rolling")
	style := fs.String("headers", "x", "budget metadata headers: x (X-RateLimit-*) | ietf (RateLimit-Policy, RateLimit) | none | ietf10 (the draft-10 fields)")
	fs.StringVar(&o.redisURL, "redis", "", "Redis URL: redis://127.0.0.1:6379/0; over TLS rediss://user:password@host:port/0 (a private CA: set SSL_CERT_FILE=ca.pem); a Redis Cluster: redis://host:port?addr=host2:port2&addr=...; Sentinel: redis://sentinel:26379?master_name=mymaster&addr=sentinel2:26379; the client's timeouts are -store-timeout (at least 100ms) and it never retries, except where the URL sets dial_timeout, read_timeout, write_timeout, pool_timeout or max_retries (left out: budgets in process; an empty value is refused)")
	policy := fs.String("store-error", "closed", "when Redis cannot decide: closed (503) | open (admit) | local (limit/replicas in process)")
	fs.IntVar(&o.replicas, "replicas", 1, "number of demo-server processes sharing the budget (for -store-error local)")
	fs.DurationVar(&o.storeTimeout, "store-timeout", 50*time.Millisecond, "deadline of each Redis decision")
	proxies := fs.String("trusted-proxies", "", "comma-separated CIDRs of proxies whose X-Forwarded-For is believed")
	fs.IntVar(&o.ipv6Prefix, "ipv6-prefix", 64, "IPv6 clients sharing this prefix length share a budget")
	fs.BoolVar(&o.noLimit, "no-limit", false, "serve the same routes without any limiter (to measure the limiter's cost)")
	fs.IntVar(&o.coalesce, "coalesce", 256, "with -redis: decide up to this many concurrent requests for one budget as one call (lua.WithCoalescing); 0: off")
	fs.IntVar(&o.maxBudgets, "max-budgets", 100_000, "without -redis: most budgets held in process; past it the least recently used budget of a shard is evicted (memory.WithMaxBudgets)")
	fs.BoolVar(&o.oneServer, "one-server", true, "with -redis: every key is on that one server (no Cluster, no sharding proxy), so rules of different identities are decided in one call (lua.WithOneServer)")
	fs.Int64Var(&o.inflight, "inflight", 2, "GET /api/slow requests running at once per client IP, across every demo server sharing the store")
	fs.DurationVar(&o.leaseTTL, "lease-ttl", 10*time.Second, "how long a crashed server's /api/slow leases hold their slots (running requests renew theirs)")
	fs.Int64Var(&o.byteLimit, "byte-limit", 1<<20, "GET /api/download response bytes per window per client IP")
	fs.BoolVar(&o.shadow, "shadow", false, "run every rule in shadow mode: decided and counted in /metrics, never refusing")
	fs.StringVar(&o.policy, "policy", "", "a policy file (docs/POLICY.md; cmd/demo-server/policy.yaml) whose rules limit /api in place of -limit and the limit flags of each route (its ip identity is the connection's peer: -trusted-proxies does not apply); reloaded when it changes and on SIGHUP")
	fs.DurationVar(&o.server.readHeaderTimeout, "read-header-timeout", defaultReadHeaderTimeout, "time to read a request's line and headers (0: no limit)")
	fs.DurationVar(&o.server.readTimeout, "read-timeout", defaultReadTimeout, "time to read a whole request, body included (0: no limit)")
	fs.DurationVar(&o.server.writeTimeout, "write-timeout", defaultWriteTimeout, "time from the end of a request's headers to the end of its response (0: no limit)")
	fs.DurationVar(&o.server.idleTimeout, "idle-timeout", defaultIdleTimeout, "time a keep-alive connection may wait for its next request (0: no limit)")
	fs.IntVar(&o.server.maxHeaderBytes, "max-header-bytes", defaultMaxHeaderBytes, "largest request line and headers, in bytes; larger ones get 431")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = io.WriteString(out, report.String())
			return o, err
		}
		return o, usageError{err, report.String()}
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q (flags only; -h lists them)", fs.Arg(0))
	}
	// An empty value given on purpose (often an unset variable, -redis "$REDIS_URL") is
	// refused, not read as the default: -addr "" would listen on every interface, and
	// -redis "" would give each process budgets of its own.
	var empty error
	whyNotEmpty := map[string]string{
		"addr":   "host:port; :8080 listens on every interface",
		"redis":  "leave the flag out to keep budgets in process",
		"policy": "leave the flag out for the limits of the flags",
	}
	fs.Visit(func(f *flag.Flag) {
		if why, ok := whyNotEmpty[f.Name]; ok && empty == nil && f.Value.String() == "" {
			empty = fmt.Errorf("-%s: must not be empty (%s)", f.Name, why)
		}
	})
	if empty != nil {
		return o, empty
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"read-header-timeout", o.server.readHeaderTimeout}, {"read-timeout", o.server.readTimeout},
		{"write-timeout", o.server.writeTimeout}, {"idle-timeout", o.server.idleTimeout},
	} {
		if f.d < 0 {
			return o, fmt.Errorf("-%s: must be 0 (no limit) or positive, got %v", f.name, f.d)
		}
	}
	if o.inflight < 1 || o.inflight > bound.MaxLimit {
		return o, fmt.Errorf("-inflight: must be from 1 to %d, got %d", int64(bound.MaxLimit), o.inflight)
	}
	if o.byteLimit < 1 || o.byteLimit > bound.MaxLimit {
		return o, fmt.Errorf("-byte-limit: must be from 1 to %d, got %d", int64(bound.MaxLimit), o.byteLimit)
	}
	if o.leaseTTL < time.Millisecond {
		return o, fmt.Errorf("-lease-ttl: must be at least 1ms, got %v", o.leaseTTL)
	}
	if o.server.maxHeaderBytes < 1 {
		return o, fmt.Errorf("-max-header-bytes: must be positive, got %d", o.server.maxHeaderBytes)
	}
	if o.limit < 1 || o.limit > bound.MaxLimit/5 {
		// The route-wide rule of /api/accounts/{id}/report admits 5×-limit.
		return o, fmt.Errorf("-limit: must be from 1 to %d (5×-limit must be at most %d), got %d", int64(bound.MaxLimit/5), int64(bound.MaxLimit), o.limit)
	}
	if o.storeTimeout <= 0 {
		return o, fmt.Errorf("-store-timeout: must be positive, got %v", o.storeTimeout)
	}
	if o.replicas < 1 {
		return o, fmt.Errorf("-replicas: must be at least 1, got %d", o.replicas)
	}
	if o.ipv6Prefix < 1 || o.ipv6Prefix > 128 {
		return o, fmt.Errorf("-ipv6-prefix: must be from 1 to 128 bits, got %d", o.ipv6Prefix)
	}
	var err error
	var ok bool
	if _, err = memory.New(memory.WithMaxBudgets(o.maxBudgets)); err != nil {
		return o, fmt.Errorf("-max-budgets: %w", err)
	}
	if *algo == "inflight" {
		return o, fmt.Errorf("-algorithm: inflight limits requests running at once, not a rate: use -inflight for /api/slow")
	}
	if o.algorithm, ok = parseAlgorithm(*algo); !ok {
		return o, fmt.Errorf("-algorithm: unknown algorithm %q (want fixed, token or rolling)", *algo)
	}
	// The rules the flags make, checked here so that an error names the flags; the
	// route-wide report-route (5×-limit) is the largest of the -limit rules.
	for _, c := range []struct {
		limitFlag, windowFlag string
		rule                  ratebudget.Rule
	}{
		{"-limit", "-window", ratebudget.Rule{Name: "report-route", Algorithm: o.algorithm, Limit: 5 * o.limit, Window: o.window}},
		{"-byte-limit", "-window", ratebudget.Rule{Name: "download", Algorithm: o.algorithm, Limit: o.byteLimit, Window: o.window}},
		{"-inflight", "-lease-ttl", ratebudget.Rule{Name: "slow", Algorithm: ratebudget.InFlight, Limit: o.inflight, Window: o.leaseTTL}},
	} {
		if err := c.rule.Validate(); err != nil {
			return o, flagError(err, c.limitFlag, c.windowFlag)
		}
	}
	switch o.style = headers.Style(*style); o.style {
	case headers.XRateLimit, headers.IETF, headers.None, headers.IETFDraft10:
	default:
		return o, fmt.Errorf("-headers: unknown style %q (want x, ietf, none or ietf10)", *style)
	}
	switch o.storeError = *policy; o.storeError {
	case "closed", "open", "local":
	default:
		return o, fmt.Errorf("-store-error: unknown policy %q (want closed, open or local)", *policy)
	}
	if o.coalesce != 0 && (o.coalesce < 2 || o.coalesce > 4096) {
		return o, fmt.Errorf("-coalesce: must be 0 (off) or 2 to 4096 requests, got %d", o.coalesce)
	}
	if *proxies != "" {
		for _, p := range strings.Split(*proxies, ",") {
			o.trustedProxies = append(o.trustedProxies, strings.TrimSpace(p))
		}
		if _, err := keyfuncs.ClientIP(keyfuncs.TrustedProxies(o.trustedProxies...), keyfuncs.FromHeader("X-Forwarded-For")); err != nil {
			return o, fmt.Errorf("-trusted-proxies: %w", err)
		}
	}
	return o, nil
}

// parseAlgorithm returns the rate time rule (FixedWindow, TokenBucket or RollingWindow)
// that the module names s.
func parseAlgorithm(s string) (ratebudget.Algorithm, bool) {
	for a := ratebudget.FixedWindow; a <= ratebudget.RollingWindow; a++ {
		if algname.Of(a) == s {
			return a, true
		}
	}
	return 0, false
}

// flagError names the flag behind a rule's invalid field: limitFlag for its Limit,
// windowFlag for its Window, both for a product of the two (a token bucket's scale).
func flagError(err error, limitFlag, windowFlag string) error {
	var ce *ratebudget.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	switch ce.Field {
	case "Limit":
		return fmt.Errorf("%s: %s", limitFlag, ce.Problem)
	case "Window":
		return fmt.Errorf("%s: %s", windowFlag, ce.Problem)
	}
	return fmt.Errorf("%s and %s: rule %q: %s", limitFlag, windowFlag, ce.Rule, ce.Problem)
}

// run serves until ctx ends. When ready is not nil it receives the listening address.
func run(ctx context.Context, args []string, out io.Writer, ready chan<- string) error {
	o, err := parseFlags(args, out)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(out, nil))
	lim, closeLim, err := newLimiter(ctx, o, log)
	if err != nil {
		return err
	}
	defer closeLim()
	var pol *policyState
	if o.policy != "" {
		if pol, err = watchPolicy(ctx, o.policy, log); err != nil {
			return err
		}
		defer pol.close()
	}
	h, err := newHandler(o, lim, log, pol)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	srv := newServer(h, o.server)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	store := "memory"
	if o.redisURL != "" {
		store = "redis"
	}
	log.Info("listening", "addr", ln.Addr().String(), "store", store, "limit", o.limit, "window", o.window, "algorithm", algname.Of(o.algorithm))
	if ready != nil {
		ready <- ln.Addr().String()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	grace := shutdownGrace
	if g, ok := ctx.Value(graceKey{}).(time.Duration); ok {
		grace = g
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// The grace is over: close the connections left, whose handlers then fail to
		// write and return (their leases are released or expire after -lease-ttl).
		_ = srv.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("shutdown: requests still running after %v were cut off", grace)
		}
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func newLimiter(ctx context.Context, o options, log *slog.Logger) (ratebudget.Limiter, func(), error) {
	if o.redisURL == "" {
		m, err := memory.New(memory.WithMaxBudgets(o.maxBudgets))
		if err != nil {
			return nil, nil, fmt.Errorf("-max-budgets: %w", err)
		}
		return m, func() {}, nil
	}
	return newRedisLimiter(ctx, o, log)
}

// newHandler builds the demo's routes. Each rule states its unit, identity, scope and
// time rule; the guide at GET / prints them.
func newHandler(o options, lim ratebudget.Limiter, log *slog.Logger, pol *policyState) (http.Handler, error) {
	ipOpts := []keyfuncs.IPOption{keyfuncs.Prefixes(32, o.ipv6Prefix)}
	if len(o.trustedProxies) > 0 {
		ipOpts = append(ipOpts, keyfuncs.TrustedProxies(o.trustedProxies...), keyfuncs.FromHeader("X-Forwarded-For"))
	}
	clientIP, err := keyfuncs.ClientIP(ipOpts...)
	if err != nil {
		return nil, err
	}
	rule := func(name string) ratebudget.Rule {
		return ratebudget.Rule{Name: name, Algorithm: o.algorithm, Limit: o.limit, Window: o.window}
	}
	m := metrics.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m, collectors.NewGoCollector())
	if rl, ok := lim.(*lua.Limiter); ok {
		// Voids of reservations whose decision was lost, and settles re-sent after a
		// failure (see lua.Limiter.Repairs).
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ratebudget_repairs_dropped_total",
			Help: "Voids and re-sent settles given up (queue full, a minute without an answer, or refused): their spend stays, an overcount.",
		}, func() float64 { _, dropped := rl.Repairs(); return float64(dropped) }))
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratebudget_repairs_pending",
			Help: "Voids and re-sent settles waiting to be sent or in flight.",
		}, func() float64 { pending, _ := rl.Repairs(); return float64(pending) }))
	}
	common := []middleware.Option{
		middleware.WithHeaders(o.style),
		middleware.WithTimeout(o.storeTimeout),
		middleware.WithObserver(m.Observe),
		middleware.WithObserver(logRefusals(log)),
		middleware.WithObserver(middleware.LogStoreErrors(log, 5*time.Second)),
		middleware.WithBreaker(middleware.Breaker{OnChange: breakerChanged(m, log)}),
	}
	switch o.storeError {
	case "open":
		common = append(common, middleware.WithFailOpen())
	case "local":
		common = append(common, middleware.WithLocalFallback(o.replicas))
	}
	api, err := pol.middleware(lim, reg, common) // on every /api route
	if err != nil {
		return nil, err
	}
	mk := func(rules []middleware.Rule, extra ...middleware.Option) (func(http.Handler) http.Handler, error) {
		if flagLimitsOff(o, pol) {
			return func(next http.Handler) http.Handler { return next }, nil
		}
		for i := range rules {
			rules[i].Shadow = o.shadow
		}
		return middleware.New(lim, rules, append(append([]middleware.Option{}, common...), extra...)...)
	}

	perIP, err := mk([]middleware.Rule{{Rule: rule("hello"), Identity: clientIP}})
	if err != nil {
		return nil, err
	}
	// An account's budget, keyed by a digest of its API key (never the key itself), and a
	// budget for the route as a whole, decided together.
	account := keyfuncs.HashedHeader("X-API-Key", nil)
	report, err := mk([]middleware.Rule{
		{Rule: rule("report-account"), Identity: account},
		{Rule: withLimit(rule("report-route"), 5*o.limit), Identity: keyfuncs.Global(), Scope: keyfuncs.RoutePattern()},
	})
	if err != nil {
		return nil, err
	}
	jobs, err := mk([]middleware.Rule{{Rule: rule("jobs"), Identity: clientIP}}, middleware.WithCost(jobCost))
	if err != nil {
		return nil, err
	}

	// Routes whose budgets are settled once the handler returns: they need a store that
	// can settle decisions ("Settling a decision" in package ratebudget).
	slow, flaky, download := notSettled, notSettled, notSettled
	if _, ok := lim.(interface {
		Settle(context.Context, []ratebudget.Check, []ratebudget.Ticket, []int64) error
	}); ok || o.noLimit {
		if slow, err = mk([]middleware.Rule{{Rule: ratebudget.Rule{Name: "slow", Algorithm: ratebudget.InFlight, Limit: o.inflight, Window: o.leaseTTL}, Identity: clientIP}}); err != nil {
			return nil, err
		}
		if flaky, err = mk([]middleware.Rule{{Rule: rule("flaky"), Identity: clientIP, Counts: middleware.CountSuccesses(nil)}}); err != nil {
			return nil, err
		}
		if download, err = mk([]middleware.Rule{{Rule: withLimit(rule("download"), o.byteLimit), Identity: clientIP, Counts: middleware.CountResponseBytes(1)}}); err != nil {
			return nil, err
		}
	}

	r := chi.NewRouter()
	// HEAD on a GET route runs the GET handler (and its limits) without the body, as
	// RFC 9110 asks; it spends the same budget as GET, so it is no way around a limit.
	r.Use(chimw.GetHead)
	r.Get("/", pol.guide(o))
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	r.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	r.Route("/api", func(r chi.Router) {
		r.Use(api)
		r.With(perIP).Get("/hello", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "hello\n")
		})
		r.With(report).Get("/accounts/{id}/report", func(w http.ResponseWriter, r *http.Request) {
			_, _ = fmt.Fprintf(w, "report for account %s\n", chi.URLParam(r, "id"))
		})
		r.With(jobs).Post("/jobs", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			_, _ = fmt.Fprintf(w, "job accepted, cost %s\n", r.URL.Query().Get("cost"))
		})
		r.With(slow).Get("/slow", slowHandler)
		r.With(flaky).Get("/flaky", flakyHandler)
		r.With(download).Get("/download", downloadHandler)
	})
	return r, nil
}

// notSettled stands in for the limits of the routes that settle when the store cannot.
func notSettled(http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "this route's budget is settled after the response, which this budget store cannot do", http.StatusNotImplemented)
	})
}

// maxSlow and maxDownload bound what one request can make the demo do.
const (
	maxSlow     = 10 * time.Second
	maxDownload = 64 << 20
)

// shutdownGrace is how long a stopping server lets running requests finish: longer than
// the longest GET /api/slow, so that none is cut (and its lease left to expire).
const shutdownGrace = maxSlow + 5*time.Second

// graceKey is the key of a context value (a time.Duration) that replaces shutdownGrace
// for the run given that context: a test's, which leaves other runs theirs.
type graceKey struct{}

// slowHandler sleeps ?ms=N milliseconds (at most 10 s), or until the client goes away.
func slowHandler(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.URL.Query().Get("ms"), 10, 64)
	if err != nil || n < 0 || n > maxSlow.Milliseconds() {
		http.Error(w, "ms must be an integer from 0 to 10000", http.StatusBadRequest)
		return
	}
	// The answer starts at once, so that a client sees it was admitted while it waits.
	_, _ = fmt.Fprintf(w, "sleeping %d ms\n", n)
	_ = http.NewResponseController(w).Flush()
	t := time.NewTimer(time.Duration(n) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		_, _ = fmt.Fprintf(w, "slept %d ms\n", n)
	case <-r.Context().Done():
	}
}

// flakyHandler answers ?status=S (200 to 599).
func flakyHandler(w http.ResponseWriter, r *http.Request) {
	s, err := strconv.Atoi(r.URL.Query().Get("status"))
	if err != nil || s < 200 || s > 599 {
		http.Error(w, "status must be an integer from 200 to 599", http.StatusBadRequest)
		return
	}
	w.WriteHeader(s)
	_, _ = fmt.Fprintf(w, "status %d\n", s)
}

// downloadHandler writes ?bytes=N bytes (at most 64 MiB).
func downloadHandler(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.URL.Query().Get("bytes"), 10, 64)
	if err != nil || n < 0 || n > maxDownload {
		http.Error(w, "bytes must be an integer from 0 to 67108864", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	chunk := make([]byte, min(n, 32<<10))
	for i := range chunk {
		chunk[i] = 'x'
	}
	for n > 0 {
		k, err := w.Write(chunk[:min(n, int64(len(chunk)))])
		if err != nil {
			return
		}
		n -= int64(k)
	}
}

func withLimit(r ratebudget.Rule, limit int64) ratebudget.Rule {
	r.Limit = limit
	return r
}

// jobCost reads ?cost=N (default 1): the job's estimated work in units. A value that is
// not a positive integer is the client's fault, and the 400 says why (middleware.InputError).
func jobCost(r *http.Request) (int64, error) {
	s := r.URL.Query().Get("cost")
	if s == "" {
		return 1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return 0, &middleware.InputError{Reason: "query parameter cost must be a positive integer", Err: fmt.Errorf("cost %q", s)}
	}
	return n, nil
}

// breakerChanged counts a breaker's transitions in m and logs them: a warning when it
// opens, a line when it closes. An open breaker probes the store without changing
// state, so a long outage logs two lines.
func breakerChanged(m *metrics.Collector, log *slog.Logger) func(open bool) {
	return func(open bool) {
		m.BreakerChanged(open)
		if open {
			log.Warn("rate-limit store circuit breaker", "from", "closed", "to", "open")
		} else {
			log.Info("rate-limit store circuit breaker", "from", "open", "to", "closed")
		}
	}
}

func logRefusals(log *slog.Logger) func(middleware.Event) {
	return func(e middleware.Event) {
		switch e.Result {
		case middleware.Allowed:
			return
		case middleware.Denied, middleware.Exceeded:
			log.Info("refused", "outcome", string(e.Result), "rule", e.Decision.Rule, "retry_after", e.Decision.RetryAfter, "path", e.Request.URL.Path)
		case middleware.Invalid:
			log.Info("unidentified request", "err", e.Err, "path", e.Request.URL.Path)
		}
	}
}

func guide(o options) http.HandlerFunc {
	// Each row is a route, what it does and its rule; a row without a route continues
	// the one above. The columns are as wide as their widest cell.
	type row struct{ route, text, rule string }
	rows := []row{
		{"GET  /", "this guide (not limited)", ""},
		{"HEAD on any GET route", "the GET answer without its body; spends the same budget", ""},
		{"GET  /healthz", "health check (never limited)", ""},
		{"GET  /metrics", "Prometheus metrics: decisions by rule and outcome, latency, store errors", ""},
		{"GET  /api/hello", fmt.Sprintf("%d requests per window per client IP (IPv6 /%d)", o.limit, o.ipv6Prefix), "hello"},
		{"GET  /api/accounts/{id}/report", fmt.Sprintf("%d per window per account (header X-API-Key)", o.limit), "report-account"},
		{"", fmt.Sprintf("and %d per window for the route as a whole", 5*o.limit), "report-route"},
		{"POST /api/jobs?cost=N", fmt.Sprintf("%d cost units per window per client IP; N units each", o.limit), "jobs"},
		{"GET  /api/slow?ms=N", fmt.Sprintf("sleeps N ms (at most 10000); %d running at once per", o.inflight), "slow"},
		{"", "client IP, over every server sharing the store", ""},
		{"GET  /api/flaky?status=S", fmt.Sprintf("answers status S; %d per window per client IP,", o.limit), "flaky"},
		{"", "charged only for responses below 500", ""},
		{"GET  /api/download?bytes=N", fmt.Sprintf("writes N bytes; %d bytes per window per client IP,", o.byteLimit), "download"},
		{"", "charged with the bytes actually written", ""},
	}
	routeWidth, textWidth := 0, 0
	for _, r := range rows {
		routeWidth = max(routeWidth, len(r.route))
		if r.rule != "" {
			textWidth = max(textWidth, len(r.text))
		}
	}
	var b strings.Builder
	if o.noLimit {
		b.WriteString("ratebudget demo with -no-limit: no route is limited; these are the budgets the routes would have\n\n")
	} else {
		fmt.Fprintf(&b, "ratebudget demo: every limited route spends from a budget (time rule %s, window %v)\n\n", algname.Of(o.algorithm), o.window)
	}
	for _, r := range rows {
		if r.rule == "" {
			fmt.Fprintf(&b, "%-*s  %s\n", routeWidth, r.route, r.text)
			continue
		}
		fmt.Fprintf(&b, "%-*s  %-*s  rule %q\n", routeWidth, r.route, textWidth, r.text, r.rule)
	}
	b.WriteString(shadowNote(o.shadow))
	b.WriteString(`
Refusals: 429 + Retry-After (over the budget; Retry-After: 1 for /api/slow), 413 (cost
above the budget), 400 (no identity, or a ?cost that is not a positive integer), 503
(budget store unavailable). Add "Accept: application/json" for application/problem+json
bodies.
`)
	text := b.String()
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, text)
	}
}

func shadowNote(shadow bool) string {
	if shadow {
		return "\nShadow mode (-shadow): every rule is decided and counted in /metrics\n(ratebudget_shadow_refusals_total) but never refuses.\n"
	}
	return ""
}
