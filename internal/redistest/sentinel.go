package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelSet is a primary with replicas watched by Sentinels, all redis-server
// processes owned by one test, started by [StartSentinel].
type SentinelSet struct {
	// MasterName is the name the Sentinels monitor the primary under.
	MasterName string
	// Master is the primary as started; Replicas replicate it.
	Master   *Server
	Replicas []*Server
	// Sentinels are the Sentinels' servers.
	Sentinels []*Server
}

// StartSentinel starts a primary, replicas (1 to 4) of it and sentinels (1 to 5)
// Sentinels with a quorum of a majority of them, which fail the primary over once it
// has not answered for downAfter (at least 100ms). It returns once every replica is in
// sync and every Sentinel knows the replicas and the other Sentinels. Everything stops
// when the test ends; like [Start] it skips without a redis-server binary.
func StartSentinel(tb testing.TB, replicas, sentinels int, downAfter time.Duration) *SentinelSet {
	tb.Helper()
	return startSentinel(tb, nil, replicas, sentinels, downAfter)
}

// StartTLSSentinel is [StartSentinel] over TLS: the primary, the replicas and the
// Sentinels speak TLS only, with certificates of one CA made for the test (each
// [Server]'s CAFile), replicas replicate over TLS and Sentinels talk to the servers and
// to each other over TLS (tls-replication yes). The Sentinels' certificate names
// 127.0.0.1 and localhost, the primary's and the replicas' 127.0.0.1 only: a client
// that checks a data node's certificate against the name it dialled a Sentinel by
// (localhost) fails, as it would where Sentinels and data nodes have certificates of
// their own. Each Server's TLSConfig trusts that CA and gives a client certificate.
func StartTLSSentinel(tb testing.TB, replicas, sentinels int, downAfter time.Duration) *SentinelSet {
	tb.Helper()
	return startSentinel(tb, newCA(tb), replicas, sentinels, downAfter)
}

func startSentinel(tb testing.TB, ca *testCA, replicas, sentinels int, downAfter time.Duration) *SentinelSet {
	tb.Helper()
	if replicas < 1 || replicas > 4 || sentinels < 1 || sentinels > 5 || downAfter < 100*time.Millisecond {
		tb.Fatalf("redistest: %d replicas, %d sentinels, down after %v", replicas, sentinels, downAfter)
	}
	var dataCA *testCA
	var tlsArgs []string
	if ca != nil {
		dataCA, tlsArgs = ca.ipOnly(tb), []string{"--tls-replication", "yes"}
	}
	set := &SentinelSet{MasterName: "rbmaster", Master: startWith(tb, "", dataCA, tlsArgs)}
	host, port, _ := net.SplitHostPort(set.Master.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for range replicas {
		r := startWith(tb, "", dataCA, append([]string{"--replicaof", host, port, "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"}, tlsArgs...))
		set.Replicas = append(set.Replicas, r)
		a := r.Client(tb)
		poll(ctx, tb, "replica "+r.Addr+" in sync", func() (bool, string) {
			info, err := a.Info(ctx, "replication").Result()
			return err == nil && strings.Contains(info, "master_link_status:up"), fmt.Sprint(info, err)
		})
	}
	quorum := sentinels/2 + 1
	for range sentinels {
		conf := filepath.Join(tb.TempDir(), "sentinel.conf")
		text := fmt.Sprintf("sentinel monitor %s %s %s %d\nsentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s %d\n",
			set.MasterName, host, port, quorum, set.MasterName, downAfter.Milliseconds(), set.MasterName, (10 * downAfter).Milliseconds())
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			tb.Fatal(err)
		}
		s := startWith(tb, conf, ca, append([]string{"--sentinel"}, tlsArgs...))
		set.Sentinels = append(set.Sentinels, s)
	}
	for _, s := range set.Sentinels {
		a := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, TLSConfig: s.TLSConfig()})
		poll(ctx, tb, "sentinel "+s.Addr+" to know the set", func() (bool, string) {
			m, err := a.Master(ctx, set.MasterName).Result()
			return err == nil && m["num-slaves"] == strconv.Itoa(replicas) && m["num-other-sentinels"] == strconv.Itoa(sentinels-1), fmt.Sprint(m, err)
		})
		// and to see every replica connected: a client asking for replicas is given the
		// primary while the Sentinel flags them disconnected (go-redis's RandomReplicaAddr)
		poll(ctx, tb, "sentinel "+s.Addr+" to see the replicas connected", func() (bool, string) {
			rs, err := a.Replicas(ctx, set.MasterName).Result()
			up := 0
			for _, r := range rs {
				if r["flags"] == "slave" {
					up++
				}
			}
			return err == nil && up == replicas, fmt.Sprint(rs, err)
		})
		a.Close()
	}
	return set
}

// SentinelAddrs returns the Sentinels' addresses, for a failover client.
func (s *SentinelSet) SentinelAddrs() []string {
	var addrs []string
	for _, sn := range s.Sentinels {
		addrs = append(addrs, sn.Addr)
	}
	return addrs
}

// WaitNewMaster polls the Sentinels, for at most within, until one names a primary
// other than old and that server reports itself a primary; it returns the new primary's
// address and when it saw it. The test fails if that never happens.
func (s *SentinelSet) WaitNewMaster(tb testing.TB, old string, within time.Duration) (string, time.Time) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var addr string
	poll(ctx, tb, "a new primary", func() (bool, string) {
		var seen []string
		// Each round asks with a second of its own, so that the last one, which the
		// failure reports, is not cut short by the deadline.
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		defer ccancel()
		for _, sn := range s.Sentinels {
			a := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr, MaxRetries: -1, ReadTimeout: time.Second, TLSConfig: sn.TLSConfig()})
			got, err := a.GetMasterAddrByName(cctx, s.MasterName).Result()
			m, _ := a.Master(cctx, s.MasterName).Result()
			a.Close()
			seen = append(seen, fmt.Sprintf("%s names %v (%v; flags %s, failover-state %s)", sn.Addr, got, err, m["flags"], m["failover-state"]))
			if err != nil || len(got) != 2 {
				continue
			}
			if cand := net.JoinHostPort(got[0], got[1]); cand != old {
				c := redis.NewClient(&redis.Options{Addr: cand, MaxRetries: -1, ReadTimeout: time.Second, TLSConfig: s.Master.TLSConfig()})
				role, err := c.Do(cctx, "ROLE").Slice()
				c.Close()
				if err == nil && len(role) > 0 && role[0] == "master" {
					addr = cand
					return true, ""
				}
				seen = append(seen, fmt.Sprintf("%s: ROLE %v (%v)", cand, role, err))
			}
		}
		return false, strings.Join(seen, "; ")
	})
	return addr, time.Now()
}
