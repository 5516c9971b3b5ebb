package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/lua"
)

// newRedisClient returns the client -redis names, in go-redis's URL forms:
//
//	redis://host:port/db                                  one server
//	redis://host:port?addr=host2:port2&addr=host3:port3   a Redis Cluster (seed nodes)
//	redis://host:port?master_name=name&addr=host2:port2   Sentinel (the Sentinels' addresses)
//
// A URL of the first form that names a Redis Cluster node (it answers CLUSTER SLOTS
// when asked at start-up, within a second) is taken as the cluster's one seed node.
// CLUSTER SLOTS is what a cluster's client needs anyway, so the ACL of a cluster's
// user grants it, and that of one server's user need not.
//
// It applies the client settings recommended for a limiter: socket deadlines that follow
// the decision's context, and short timeouts with no retries of a failed dial, so that a
// failing Redis costs a request at most the decision deadline (the limiter itself never
// lets the client re-send a script). Timeouts and retries the URL sets (dial_timeout,
// read_timeout, write_timeout, pool_timeout, max_retries) are kept. Over TLS, a
// Sentinel client checks each server's certificate for the host it dials (the
// Sentinels name the data nodes), not for the first Sentinel's, and a cluster client
// takes a node's certificate if it is valid for the host it dials or for the first
// seed's host (see [checkEachNode]). cluster reports a Redis Cluster. Its errors start
// with -redis and never show the URL's user name or password.
func newRedisClient(ctx context.Context, rawURL string, timeout time.Duration) (client redis.UniversalClient, cluster bool, err error) {
	newClient, cluster, asCluster, err := parseRedisURL(rawURL, timeout)
	if err != nil {
		return nil, false, fmt.Errorf("-redis: %w", hideCredentials(rawURL, timeout, err))
	}
	client = newClient()
	if asCluster != nil {
		// One server's URL may name a cluster node: a plain client would get MOVED for
		// most keys. A server without cluster support answers an error.
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := client.ClusterSlots(pctx).Err(); err == nil {
			client.Close()
			return asCluster(), true, nil
		}
	}
	return client, cluster, nil
}

// parseRedisURL checks rawURL and returns how to make its client, and for the URL of
// one server, how to make a cluster client with that server as its seed.
func parseRedisURL(rawURL string, timeout time.Duration) (newClient func() redis.UniversalClient, cluster bool, asCluster func() redis.UniversalClient, err error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, false, nil, err
	}
	q := u.Query()
	t := max(timeout, 100*time.Millisecond)
	switch {
	case q.Has("master_name"):
		opt, err := redis.ParseFailoverURL(rawURL)
		if err != nil {
			return nil, false, nil, err
		}
		switch {
		case opt.MasterName == "":
			return nil, false, nil, errors.New("master_name must not be empty")
		case opt.ReplicaOnly:
			return nil, false, nil, errors.New("replica_only does not apply: the limiter's scripts write, so they run on the primary")
		case opt.RouteByLatency || opt.RouteRandomly:
			// NewFailoverClient panics on them.
			return nil, false, nil, errors.New("route_by_latency and route_randomly do not apply to Sentinel: the limiter's scripts run on the primary")
		}
		if err := checkPorts(opt.SentinelAddrs...); err != nil {
			return nil, false, nil, err
		}
		if opt.TLSConfig != nil {
			// go-redis checks every certificate, the data nodes' included, against the
			// first Sentinel's host name. Sentinels name the primary by its address, and
			// each server has a certificate of its own: check the host each connection
			// dials instead.
			opt.TLSConfig.ServerName = ""
		}
		opt.DialerRetries, opt.ContextTimeoutEnabled = 1, true
		limiterDefaults(q, t, &opt.MaxRetries, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.PoolTimeout)
		return func() redis.UniversalClient { return redis.NewFailoverClient(opt) }, false, nil, nil
	case q.Has("addr"):
		opt, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return nil, false, nil, err
		}
		if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
			// ParseClusterURL ignores the path.
			return nil, false, nil, fmt.Errorf("a Redis Cluster has only database 0, got path %q", u.Path)
		}
		if err := checkPorts(opt.Addrs...); err != nil {
			return nil, false, nil, err
		}
		opt.DialerRetries, opt.ContextTimeoutEnabled = 1, true
		limiterDefaults(q, t, &opt.MaxRetries, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.PoolTimeout)
		checkEachNode(opt)
		return func() redis.UniversalClient { return redis.NewClusterClient(opt) }, true, nil, nil
	}
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, false, nil, err
	}
	if opt.Network == "tcp" {
		if err := checkPorts(opt.Addr); err != nil {
			return nil, false, nil, err
		}
	}
	opt.DialerRetries, opt.ContextTimeoutEnabled = 1, true
	limiterDefaults(q, t, &opt.MaxRetries, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.PoolTimeout)
	newClient = func() redis.UniversalClient { return redis.NewClient(opt) }
	if opt.Network != "tcp" || opt.DB != 0 {
		return newClient, false, nil, nil // a cluster node listens on TCP, with database 0 only
	}
	asCluster = func() redis.UniversalClient {
		copt := &redis.ClusterOptions{
			Addrs: []string{opt.Addr}, ClientName: opt.ClientName, Protocol: opt.Protocol,
			Username: opt.Username, Password: opt.Password, TLSConfig: opt.TLSConfig,
			MaxRetries: opt.MaxRetries, DialerRetries: 1, ContextTimeoutEnabled: true,
			MinRetryBackoff: opt.MinRetryBackoff, MaxRetryBackoff: opt.MaxRetryBackoff,
			DialTimeout: opt.DialTimeout, ReadTimeout: opt.ReadTimeout,
			WriteTimeout: opt.WriteTimeout, PoolTimeout: opt.PoolTimeout,
			PoolFIFO: opt.PoolFIFO, PoolSize: opt.PoolSize, MinIdleConns: opt.MinIdleConns,
			MaxIdleConns: opt.MaxIdleConns, MaxActiveConns: opt.MaxActiveConns,
			ConnMaxIdleTime: opt.ConnMaxIdleTime, ConnMaxLifetime: opt.ConnMaxLifetime,
		}
		checkEachNode(copt)
		return redis.NewClusterClient(copt)
	}
	return newClient, false, asCluster, nil
}

// checkEachNode makes a cluster client over TLS that verifies certificates take a
// node's certificate if it is valid for the host the connection dials, or else for the
// first seed's host. go-redis checks every node against the first seed's host name
// alone (ServerName), and the cluster names its nodes by address, or by the names of
// cluster-announce-hostname: nodes with certificates of their own failed every
// handshake but the first seed's. A certificate for the seed's name is still taken
// from every node, as go-redis takes it, for services whose nodes share one
// certificate for the seed's name and are announced by address. A connection to an
// address sends the seed's name (SNI), as before; one to a host name sends that name.
func checkEachNode(opt *redis.ClusterOptions) {
	conf := opt.TLSConfig
	if conf == nil || conf.InsecureSkipVerify {
		return
	}
	seed := conf.ServerName
	opt.NewClient = func(o *redis.Options) *redis.Client {
		if host, _, err := net.SplitHostPort(o.Addr); err == nil && host != seed {
			o.TLSConfig = nodeTLSConfig(conf, host, seed)
		}
		return redis.NewClient(o)
	}
}

// nodeTLSConfig is conf for a connection to host, that takes a certificate valid for
// host or for seed (which may be "": host only).
func nodeTLSConfig(conf *tls.Config, host, seed string) *tls.Config {
	c := conf.Clone()
	if net.ParseIP(host) == nil || seed == "" {
		c.ServerName = host
	} else {
		c.ServerName = seed
	}
	c.InsecureSkipVerify = true // the chain and the name are verified below, with the same roots
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tls: the server gave no certificate")
		}
		vo := x509.VerifyOptions{Roots: conf.RootCAs, Intermediates: x509.NewCertPool(), DNSName: host}
		if conf.Time != nil {
			vo.CurrentTime = conf.Time()
		}
		for _, ic := range cs.PeerCertificates[1:] {
			vo.Intermediates.AddCert(ic)
		}
		_, err := cs.PeerCertificates[0].Verify(vo)
		if err == nil {
			return nil
		}
		if seed != "" {
			vo.DNSName = seed
			if _, serr := cs.PeerCertificates[0].Verify(vo); serr == nil {
				return nil
			}
		}
		return fmt.Errorf("tls: %w", err)
	}
	return c
}

// checkPorts reports an address whose port is not one that can be dialled (1 to
// 65535). go-redis takes any digits, and the dial fails on every request: the demo
// would start with a Redis that is not down but unreachable by construction.
func checkPorts(addrs ...string) error {
	for _, a := range addrs {
		_, port, err := net.SplitHostPort(a)
		if err != nil {
			return fmt.Errorf("address %q: %w", a, err)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("address %q: port must be from 1 to 65535", a)
		}
	}
	return nil
}

// limiterDefaults sets the client settings recommended for a limiter, each unless the
// URL's query q gives it: no retries (max_retries), and timeout t for dialing, reading,
// writing and waiting for a pooled connection (dial_timeout, read_timeout,
// write_timeout, pool_timeout). A value the URL gives is go-redis's to read (there,
// max_retries=0 means 3 retries and -1 none).
func limiterDefaults(q url.Values, t time.Duration, maxRetries *int, dial, read, write, pool *time.Duration) {
	if !q.Has("max_retries") {
		*maxRetries = -1
	}
	for _, d := range []struct {
		param string
		v     *time.Duration
	}{{"dial_timeout", dial}, {"read_timeout", read}, {"write_timeout", write}, {"pool_timeout", pool}} {
		if !q.Has(d.param) {
			*d.v = t
		}
	}
}

// hideCredentials returns parseRedisURL's error err for rawURL, made without the
// URL's user name and password. A parse error quotes the URL, and a password with an
// unescaped '/', '?' or '#' is read as part of the host, the port or the path, which
// the errors of go-redis quote. So when rawURL has an '@', the error is that of rawURL
// with everything before its last '@' (after the scheme) masked; if that URL is valid,
// the fault was in the masked part.
func hideCredentials(rawURL string, timeout time.Duration, err error) error {
	if at := strings.LastIndex(rawURL, "@"); at >= 0 {
		start := 0
		if i := strings.Index(rawURL, "://"); i >= 0 && i < at {
			start = i + len("://")
		}
		masked := rawURL[:start] + "xxxxx" + rawURL[at:]
		if _, _, _, err = parseRedisURL(masked, timeout); err == nil {
			return errors.New("the user name or password is not valid in a URL: percent-encode the characters / ? # @ % and spaces in them")
		}
	}
	// The URL itself may still hold a password in its query (password=).
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("not a valid URL (want redis://host:port/db, rediss://..., unix:///path, or a cluster's or Sentinel's form): %w", ue.Err)
	}
	return err
}

// keySecretEnv names the environment variable holding the secret that keys the
// budget keys' digests (lua.WithKeySecret); every replica must be given the same one.
const keySecretEnv = "RATEBUDGET_KEY_SECRET"

func newRedisLimiter(ctx context.Context, o options, log *slog.Logger) (ratebudget.Limiter, func(), error) {
	client, cluster, err := newRedisClient(ctx, o.redisURL, o.storeTimeout)
	if err != nil {
		return nil, nil, err
	}
	if cluster && o.oneServer {
		// A cluster's keys live on several servers: rules of different slots are
		// decided slot by slot.
		log.Info("-one-server does not apply to a Redis Cluster; rules of different hash slots are decided slot by slot")
		o.oneServer = false
	}
	opts := []lua.Option{lua.WithPrefix("rb-demo")}
	if secret := os.Getenv(keySecretEnv); secret != "" {
		opts = append(opts, lua.WithKeySecret([]byte(secret)))
	}
	if o.oneServer {
		opts = append(opts, lua.WithOneServer())
	}
	if o.coalesce > 0 {
		opts = append(opts, lua.WithCoalescing(o.coalesce))
	}
	lim, err := lua.New(client, opts...)
	if err != nil {
		client.Close()
		// The limiter refuses options by their lua or go-redis name: say where they
		// came from.
		var ce *ratebudget.ConfigError
		if errors.As(err, &ce) && ce.Field == "WithKeySecret" {
			return nil, nil, fmt.Errorf("%s: %w", keySecretEnv, err)
		}
		return nil, nil, fmt.Errorf("-redis: %w", err)
	}
	if os.Getenv(keySecretEnv) == "" {
		log.Warn("budget keys are not keyed by a secret: anyone can compute which Redis Cluster slot an identity lands in; set " + keySecretEnv + " (16 to 1024 bytes, the same on every replica)")
	}
	// Load the scripts and open connections now, so that the first decisions do not
	// pay for it within their deadline. Starting without Redis is allowed: the failure
	// policy applies until it answers.
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := lim.Load(lctx); err != nil {
		log.Warn("redis not ready at startup; the store-error policy applies until it is", "policy", o.storeError, "err", err)
	}
	return lim, func() { client.Close() }, nil
}
