package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget/internal/redistest"
)

// TestDemoOnTLSSentinel: the demo on a Sentinel set whose primary, replica and
// Sentinels all speak only TLS, named by rediss://localhost:port?master_name=...&addr=...
// with SSL_CERT_FILE naming the CA. The Sentinels are named by host name and
// announce the data nodes by address, each with a certificate of its own (as
// redistest.StartTLSSentinel makes them), so each connection must check the name it
// dials. 100 concurrent requests of one client on -limit 50 get exactly 50 answers 200
// and 50 answers 429, for -algorithm fixed and token; then after SENTINEL FAILOVER,
// every one of 20 new clients is decided on the promoted replica (its keys appear
// there), as TestSentinelFailover (integration_test) expects of a killed primary.
func TestDemoOnTLSSentinel(t *testing.T) {
	set := redistest.StartTLSSentinel(t, 1, 3, time.Second)
	t.Setenv("SSL_CERT_FILE", set.Master.CAFile)
	var addrs []string
	for _, a := range set.SentinelAddrs() {
		addrs = append(addrs, strings.Replace(a, "127.0.0.1", "localhost", 1))
	}
	u := "rediss://" + addrs[0] + "?master_name=" + set.MasterName + "&addr=" + strings.Join(addrs[1:], "&addr=")
	args := []string{"-redis", u, "-limit", "50", "-window", "1m", "-store-timeout", "2s", "-trusted-proxies", "127.0.0.1/32"}
	var fixed *demoProcess
	for _, algo := range []string{"fixed", "token"} {
		d := startDemoProcess(t, append(args, "-algorithm", algo)...)
		if got := burst(t, d.base+"/api/hello", "203.0.113.1", 100); got[200] != 50 || got[429] != 50 {
			t.Fatalf("-algorithm %s: 100 concurrent requests on -limit 50: %v, want 50 x 200 and 50 x 429", algo, got)
		}
		if algo == "fixed" {
			fixed = d
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sc := redis.NewSentinelClient(&redis.Options{Addr: set.Sentinels[0].Addr, MaxRetries: -1, TLSConfig: set.Sentinels[0].TLSConfig()})
	defer sc.Close()
	if err := sc.Failover(ctx, set.MasterName).Err(); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	newMaster, promoted := set.WaitNewMaster(t, set.Master.Addr, 30*time.Second)
	nc := redis.NewClient(&redis.Options{Addr: newMaster, MaxRetries: -1, TLSConfig: set.Master.TLSConfig()})
	defer nc.Close()
	keys0, err := nc.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// 20 clients the demo has not seen ask every 100ms (their budget lasts 5s); each
	// admitted request writes its client's key, which is on the new primary once the
	// demo decides there.
	const clients = 20
	var (
		mu    sync.Mutex
		codes = map[int]int{}
		stop  = make(chan struct{})
		wg    sync.WaitGroup
	)
	for i := range clients {
		wg.Go(func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				req, _ := http.NewRequest("GET", fixed.base+"/api/hello", nil)
				req.Header.Set("X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1))
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
					mu.Lock()
					codes[resp.StatusCode]++
					mu.Unlock()
				}
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		})
	}
	target := time.Second // TestSentinelFailover's, without the detection time: the failover was asked for
	limit := time.NewTimer(time.Until(promoted.Add(target + 10*time.Second)))
	defer limit.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	var keys int64
wait:
	for {
		if keys, err = nc.DBSize(ctx).Result(); err == nil && keys >= keys0+clients {
			break
		}
		select {
		case <-poll.C: // polling the new primary's keys; no event to wait on
		case <-limit.C:
			break wait
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("new primary named %v after SENTINEL FAILOVER; %v after that it held keys of %d new clients (target %v); answers %v",
		promoted.Sub(started).Round(time.Millisecond), time.Since(promoted).Round(time.Millisecond), keys-keys0, target, codes)
	if keys < keys0+clients {
		t.Errorf("the new primary holds %d keys more than at its naming, want at least %d (one per new client) within %v", keys-keys0, clients, target+10*time.Second)
	}
}
