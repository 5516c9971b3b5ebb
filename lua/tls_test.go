package lua_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// tlsClient returns a client of addr over TLS with conf, with the limiter's settings
// and a deadline generous enough for concurrent handshakes on a loaded machine.
func tlsClient(t *testing.T, addr string, conf *tls.Config) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: conf, MaxRetries: -1, DialerRetries: 1,
		ContextTimeoutEnabled: true, DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

// concurrentAdmits runs n decisions of checks(i) at once and returns how many were
// admitted; any error fails the test.
func concurrentAdmits(t *testing.T, l *lua.Limiter, n int, checks func(i int) []ratebudget.Check) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var admitted atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			d, err := l.Allow(ctx, checks(i))
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed {
				admitted.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	return int(admitted.Load())
}

// TestTLSDecidesExactly: over TLS (a server that speaks nothing else), 100 concurrent
// decisions on a budget of 50 admit exactly 50, for every time rule, through a client
// and its auto-pipeline.
func TestTLSDecidesExactly(t *testing.T) {
	srv := redistest.StartTLS(t)
	if err := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialerRetries: 1}).Ping(context.Background()).Err(); err == nil {
		t.Fatal("the TLS server answered a client without TLS")
	}
	c := tlsClient(t, srv.Addr, srv.TLSConfig())
	ap, err := c.AsyncAutoPipeline()
	must(t, err)
	for _, client := range []struct {
		name string
		c    redis.Scripter
	}{{"Client", c}, {"AutoPipeliner", ap}} {
		t.Run(client.name, func(t *testing.T) {
			l := newLimiter(t, client.c, lua.WithRefusalCache(0))
			must(t, l.Load(context.Background()))
			for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow, ratebudget.InFlight} {
				rule := ratebudget.Rule{Name: fmt.Sprint("r", alg), Algorithm: alg, Limit: 50, Window: time.Hour}
				if alg == ratebudget.TokenBucket {
					rule.Burst = 50
				}
				got := concurrentAdmits(t, l, 100, func(int) []ratebudget.Check {
					return []ratebudget.Check{{Rule: rule, Identity: "ann", Cost: 1}}
				})
				if got != 50 {
					t.Errorf("%s: %d of 100 admitted on a limit of 50", algname.Of(alg), got)
				}
			}
		})
	}
}

// TestDocumentedACLOverTLS: the user with exactly the permissions docs/FAILURE.md gives
// makes every kind of call over TLS (TestDocumentedACL's calls: every time rule, two
// slot groups with a refund, Reserve, Renew, Settle below and above the reservation).
func TestDocumentedACLOverTLS(t *testing.T) {
	srv := redistest.StartTLS(t)
	c := aclClient(t, srv, srv.Client(t), "pw", limiterACL(t, "acl"))
	if c.Options().TLSConfig == nil {
		t.Fatal("the ACL user's client does not use TLS")
	}
	documentedACLCalls(t, c)
	wantNoPermissionErrors(t, srv)
}

// TestTLSHandshakeFailureIsCertain: a server whose certificate the client does not
// accept (signed by a CA it does not trust: none but the system roots, or another
// private CA; or for another host name), or that requires a client certificate the
// client does not give (tls-auth-clients yes, a TLS alert from the server), refuses
// the connection before any command runs. Load, decisions and reservations get a
// certain connection StoreError that names the cause, and nothing is spent. Given the
// right CA and a client certificate, the same server decides.
func TestTLSHandshakeFailureIsCertain(t *testing.T) {
	srv := redistest.StartTLS(t, "--tls-auth-clients", "optional")
	certRequired := redistest.StartTLS(t, "--tls-auth-clients", "yes")
	other := redistest.StartTLS(t)
	wrongName := srv.TLSConfig()
	wrongName.ServerName = "redis.invalid"
	noCert := certRequired.TLSConfig()
	noCert.Certificates = nil
	for _, tc := range []struct {
		name  string
		srv   *redistest.Server
		conf  *tls.Config
		cause string
	}{
		{"system roots", srv, &tls.Config{}, "certificate signed by unknown authority"},
		{"another CA", srv, other.TLSConfig(), "certificate signed by unknown authority"},
		{"another host name", srv, wrongName, "not redis.invalid"},
		{"no client certificate", certRequired, noCert, "remote error: tls: certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLimiter(t, tlsClient(t, tc.srv.Addr, tc.conf), lua.WithRefusalCache(0))
			checks := stateChecks("ann")
			wantCertainConnection(t, "Load", l.Load(context.Background()), tc.cause)
			_, err := l.Allow(context.Background(), checks)
			wantCertainConnection(t, "Allow", err, tc.cause)
			_, err = l.Reserve(context.Background(), checks, make([]ratebudget.Ticket, len(checks)), nil)
			wantCertainConnection(t, "Reserve", err, tc.cause)
			wantUnspent(t, tc.srv.Client(t), l, checks)

			l = newLimiter(t, tlsClient(t, tc.srv.Addr, tc.srv.TLSConfig()), lua.WithRefusalCache(0))
			must(t, l.Load(context.Background()))
			if d, err := l.Allow(context.Background(), checks); err != nil || !d.Allowed {
				t.Fatalf("Allow with the server's CA and a client certificate: %+v, %v", d, err)
			}
		})
	}
}

// wantCertainConnection fails unless err is a certain connection StoreError whose text
// holds cause.
func wantCertainConnection(t *testing.T, what string, err error, cause string) {
	t.Helper()
	var se *ratebudget.StoreError
	if !errors.As(err, &se) || se.Class != ratebudget.ClassConnection || se.Uncertain || !strings.Contains(err.Error(), cause) {
		t.Fatalf("%s: %v, want a certain connection StoreError naming %q", what, err, cause)
	}
}

// TestPlaintextClientOfTLSServer: a client without TLS (redis:// for rediss://) of a
// server that speaks only TLS gets a connection error from Load: the server closes the
// connection on the first bytes. The client cannot tell that nothing ran, so the error
// is uncertain; nothing is spent.
func TestPlaintextClientOfTLSServer(t *testing.T) {
	srv := redistest.StartTLS(t)
	l := newLimiter(t, tlsClient(t, srv.Addr, nil), lua.WithRefusalCache(0))
	var se *ratebudget.StoreError
	if err := l.Load(context.Background()); !errors.As(err, &se) || se.Class != ratebudget.ClassConnection {
		t.Fatalf("Load: %v, want a connection StoreError", err)
	}
	checks := stateChecks("ann")
	if _, err := l.Allow(context.Background(), checks); !errors.As(err, &se) || se.Class != ratebudget.ClassConnection {
		t.Fatalf("Allow: %v, want a connection StoreError", err)
	}
	wantUnspent(t, srv.Client(t), l, checks)
}

// TestTLSCluster: on a Redis Cluster over TLS (tls-cluster yes, a ClusterClient with a
// TLSConfig), 100 concurrent decisions of a service-wide budget of 50 next to a budget
// per identity (of another slot, mostly on another master) admit exactly 50, decided
// across slots with the later refusals given back; the per-identity budgets are spread
// over the masters. The documented ACL user, with +cluster|slots, decides too.
func TestTLSCluster(t *testing.T) {
	ctx := context.Background()
	cc, nodes := redistest.StartTLSCluster(t, 3)
	l := newLimiter(t, cc, lua.WithRefusalCache(0))
	must(t, l.Load(ctx))
	site := ratebudget.Check{Rule: ratebudget.Rule{Name: "site", Limit: 50, Window: time.Hour}, Cost: 1}
	per := ratebudget.Rule{Name: "per", Limit: 5, Window: time.Hour}
	got := concurrentAdmits(t, l, 100, func(i int) []ratebudget.Check {
		return []ratebudget.Check{site, {Rule: per, Identity: fmt.Sprint("id", i%20), Cost: 1}}
	})
	if got != 50 {
		t.Fatalf("%d of 100 admitted on a service-wide limit of 50", got)
	}
	holding, spent := 0, 0
	for _, n := range nodes {
		keys, err := n.Client(t).Keys(ctx, "*").Result()
		must(t, err)
		if len(keys) > 0 {
			holding++
		}
	}
	for i := range 20 {
		v, err := cc.Get(ctx, l.Key(ratebudget.Check{Rule: per, Identity: fmt.Sprint("id", i)})).Int()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		spent += v
	}
	if holding < 2 || spent != 50 {
		t.Fatalf("keys on %d of 3 masters, %d spent per identity: want at least 2, and 50 (the refused given back)", holding, spent)
	}

	documentedClusterACLCalls(t, nodes)
}

// TestTLSStalledHandshakeKeepsTheDeadline: a server that stops answering (SIGSTOP)
// before a new connection's TLS handshake is done holds the decision no longer than
// its deadline (100ms), not the client's DialTimeout (5s): go-redis dials in the
// background. The error is a timeout, uncertain: the client cannot tell a handshake
// that did not end from a reply that did not come.
func TestTLSStalledHandshakeKeepsTheDeadline(t *testing.T) {
	srv := redistest.StartTLS(t)
	l := newLimiter(t, tlsClient(t, srv.Addr, srv.TLSConfig()), lua.WithRefusalCache(0))
	srv.Freeze(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.Allow(ctx, stateChecks("ann")[:1])
	took := time.Since(start)
	var se *ratebudget.StoreError
	if !errors.As(err, &se) || se.Class != ratebudget.ClassTimeout || took > 2*time.Second {
		t.Fatalf("Allow on a frozen TLS server: %v after %v, want a timeout at the 100ms deadline", err, took)
	}
	srv.Thaw(t)
}
