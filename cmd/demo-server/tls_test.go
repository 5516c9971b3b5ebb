package main

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget/internal/redistest"
)

// burst sends n concurrent GETs of url, as the client ip (X-Forwarded-For), and counts
// the answers by status.
func burst(t *testing.T, url, ip string, n int) map[int]int {
	t.Helper()
	codes := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			req, _ := http.NewRequest("GET", url, nil)
			req.Header.Set("X-Forwarded-For", ip)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	return codes
}

// setACLUser gives the user limiter, password pw, the ACL that docs/FAILURE.md gives
// (with the cluster's rules if cluster), for the demo's keys, on every server.
func setACLUser(t *testing.T, cluster bool, servers ...*redistest.Server) {
	t.Helper()
	rules, extra := redistest.DocumentedACL(t, "rb-demo", "pw")
	if cluster {
		rules = append(rules, extra...)
	}
	for _, s := range servers {
		if err := s.Client(t).Do(context.Background(), append([]any{"ACL", "SETUSER", "limiter", "reset"}, rules...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDemoOverTLS: the demo on a Redis that speaks only TLS, with a certificate of a
// private CA, logged in as the user of the documented ACL, named by
// rediss://limiter:pw@host:port/0. Go reads SSL_CERT_FILE instead of the system's CA
// bundle, so with SSL_CERT_FILE naming the CA the demo decides: 100 concurrent
// requests of one client on -limit 50 get exactly 50 answers 200 and 50 answers 429,
// and the 500s of /api/flaky are given back (settles) so that none is refused. Without
// the CA, every decision fails the handshake: 503, counted as certain connection
// errors. skip_verify=true (no verification: for tests only) also decides.
func TestDemoOverTLS(t *testing.T) {
	srv := redistest.StartTLS(t)
	setACLUser(t, false, srv)
	rediss := "rediss://limiter:pw@" + srv.Addr + "/0"
	args := []string{"-limit", "50", "-window", "1m", "-store-timeout", "2s", "-trusted-proxies", "127.0.0.1/32"}
	t.Run("SSL_CERT_FILE", func(t *testing.T) {
		t.Setenv("SSL_CERT_FILE", srv.CAFile)
		d := startDemoProcess(t, append(args, "-redis", rediss)...)
		if got := burst(t, d.base+"/api/hello", "203.0.113.1", 100); got[200] != 50 || got[429] != 50 {
			t.Fatalf("100 concurrent requests on -limit 50: %v, want 50 x 200 and 50 x 429", got)
		}
		for i := range 60 {
			if code := get(t, "GET", d.base+"/api/flaky?status=500", nil).StatusCode; code != 500 {
				t.Fatalf("flaky 500 number %d: %d (its budget is 50, and every 500 is given back)", i+1, code)
			}
		}
	})
	t.Run("no CA", func(t *testing.T) {
		t.Setenv("SSL_CERT_FILE", "")
		d := startDemoProcess(t, append(args, "-redis", rediss)...)
		if got := burst(t, d.base+"/api/hello", "203.0.113.2", 10); got[503] != 10 {
			t.Fatalf("requests without the CA: %v, want 503 x10", got)
		}
		if n := metricValue(t, d.base, `ratebudget_store_errors_total{class="connection",uncertain="false"}`); n < 1 {
			t.Fatalf("%v certain connection errors counted, want at least 1", n)
		}
	})
	t.Run("skip_verify", func(t *testing.T) {
		t.Setenv("SSL_CERT_FILE", "")
		d := startDemoProcess(t, append(args, "-redis", rediss+"?skip_verify=true")...)
		if got := burst(t, d.base+"/api/hello", "203.0.113.3", 100); got[200] != 50 || got[429] != 50 {
			t.Fatalf("100 concurrent requests on -limit 50: %v, want 50 x 200 and 50 x 429", got)
		}
	})
}

// TestDemoOnTLSCluster: the demo on a Redis Cluster over TLS (tls-cluster yes), logged
// in as the user of the documented ACL with the cluster's rules, with SSL_CERT_FILE
// naming the CA, given the seed nodes (rediss://...?addr=...) or one node's URL: every
// client gets exactly the limit, as on a cluster without TLS. Also when the first seed
// is named by a host name that only its own certificate names (as
// redistest.StartTLSCluster makes them) and the cluster announces the nodes by
// address: 100 concurrent requests of each of 6 clients on -limit 50 get exactly 50
// answers 200 and 50 answers 429.
func TestDemoOnTLSCluster(t *testing.T) {
	_, nodes := redistest.StartTLSCluster(t, 3)
	setACLUser(t, true, nodes...)
	t.Setenv("SSL_CERT_FILE", nodes[0].CAFile)
	for name, u := range map[string]string{
		"Seeds":   "rediss://limiter:pw@" + nodes[0].Addr + "?addr=" + nodes[1].Addr + "&addr=" + nodes[2].Addr,
		"OneNode": "rediss://limiter:pw@" + nodes[1].Addr,
	} {
		t.Run(name, func(t *testing.T) {
			for _, n := range nodes {
				if err := n.Client(t).FlushAll(t.Context()).Err(); err != nil {
					t.Fatal(err)
				}
			}
			d := startDemoProcess(t, "-redis", u, "-limit", "3", "-window", "1m", "-store-timeout", "2s", "-trusted-proxies", "127.0.0.1/32")
			checkDemoOnCluster(t, d.base, nodes)
		})
	}
	// The first node named by host name (its certificate names localhost, the others'
	// 127.0.0.1 only), the others as the cluster announces them, by address: each
	// connection must check the name it dials.
	_, port, _ := net.SplitHostPort(nodes[0].Addr)
	seed := "localhost:" + port
	for name, u := range map[string]string{
		"SeedsByName":   "rediss://limiter:pw@" + seed + "?addr=" + nodes[1].Addr + "&addr=" + nodes[2].Addr,
		"OneNodeByName": "rediss://limiter:pw@" + seed,
	} {
		t.Run(name, func(t *testing.T) {
			for _, n := range nodes {
				if err := n.Client(t).FlushAll(t.Context()).Err(); err != nil {
					t.Fatal(err)
				}
			}
			d := startDemoProcess(t, "-redis", u, "-limit", "50", "-window", "1m", "-store-timeout", "2s", "-trusted-proxies", "127.0.0.1/32")
			for ip := 1; ip <= 6; ip++ {
				if got := burst(t, d.base+"/api/hello", "203.0.113."+strconv.Itoa(ip), 100); got[200] != 50 || got[429] != 50 {
					t.Fatalf("client %d: 100 concurrent requests on -limit 50: %v, want 50 x 200 and 50 x 429", ip, got)
				}
			}
			holding := 0
			for _, n := range nodes {
				keys, err := n.Client(t).Keys(t.Context(), "rb-demo:*").Result()
				if err != nil {
					t.Fatal(err)
				}
				if len(keys) > 0 {
					holding++
				}
			}
			if holding < 2 {
				t.Fatalf("the budgets of 6 clients are on %d of 3 masters, want at least 2", holding)
			}
		})
	}
}

// TestRedisURLTLS: rediss:// gives every form of -redis a TLS client that verifies the
// server's certificate for the URL's host (in Sentinel's form, for the host each
// connection dials: the Sentinels name the data nodes), and skip_verify=true turns
// verification off, except in the cluster's form, where go-redis refuses it.
func TestRedisURLTLS(t *testing.T) {
	for _, u := range []string{
		"rediss://u:p@127.0.0.1:6380/0",
		"rediss://u:p@127.0.0.1:7000?addr=127.0.0.1:7001",
		"rediss://u:p@127.0.0.1:26379?master_name=m&addr=127.0.0.1:26380",
	} {
		for _, skip := range []bool{false, true} {
			raw := u
			if skip {
				raw += map[bool]string{true: "&", false: "?"}[strings.Contains(u, "?")] + "skip_verify=true"
			}
			newClient, _, _, err := parseRedisURL(raw, 0)
			if skip && strings.Contains(raw, "?addr=") {
				if err == nil || !strings.Contains(err.Error(), "skip_verify") {
					t.Errorf("%s: %v, want an error naming skip_verify", raw, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", raw, err)
			}
			c := newClient()
			conf := tlsConfigOf(t, c)
			c.Close()
			host, _ := url.Parse(raw)
			want := host.Hostname()
			if strings.Contains(raw, "master_name=") {
				want = ""
			}
			if conf == nil {
				t.Fatalf("%s: no TLS config", raw)
			}
			if conf.ServerName != want || conf.InsecureSkipVerify != skip {
				t.Errorf("%s: TLS config ServerName %q, InsecureSkipVerify %v, want %q, %v", raw, conf.ServerName, conf.InsecureSkipVerify, want, skip)
			}
		}
	}
}

// tlsConfigOf returns the TLS settings of c, a client of one server (or a failover
// client) or of a cluster.
func tlsConfigOf(t *testing.T, c redis.UniversalClient) *tls.Config {
	t.Helper()
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().TLSConfig
	case *redis.ClusterClient:
		return c.Options().TLSConfig
	}
	t.Fatalf("client %T", c)
	return nil
}
