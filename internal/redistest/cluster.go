package redistest

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartCluster starts n (1 to 16) redis-server processes as one Redis Cluster of masters,
// the 16384 hash slots split evenly between them, and returns a cluster client with the
// limiter's recommended settings once every node reports the cluster ok. Everything
// stops when the test ends. Like Start it skips without a redis-server binary.
func StartCluster(tb testing.TB, n int) (*redis.ClusterClient, []*Server) {
	tb.Helper()
	return startCluster(tb, n, nil)
}

// StartTLSCluster is [StartCluster] over TLS: every node is started as by [StartTLS],
// with certificates of one CA, and talks to the others over TLS (tls-cluster yes). The
// client and each node's [Server.Client] trust that CA.
func StartTLSCluster(tb testing.TB, n int) (*redis.ClusterClient, []*Server) {
	tb.Helper()
	return startCluster(tb, n, newCA(tb))
}

func startCluster(tb testing.TB, n int, ca *testCA) (*redis.ClusterClient, []*Server) {
	tb.Helper()
	if n < 1 || n > 16 {
		tb.Fatalf("redistest: cluster of %d nodes", n)
	}
	nodes := make([]*Server, n)
	bus := make([]int, n)
	for i := range nodes {
		// The cluster bus needs a port of its own; the default (port+10000) may not exist.
		bus[i] = freePort(tb)
		args := []string{"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus[i]),
			"--cluster-node-timeout", "5000"}
		if ca != nil {
			args = append(args, "--tls-cluster", "yes")
		}
		nodes[i] = startWith(tb, "", ca, args)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	per := 16384 / n
	admins := make([]*redis.Client, n)
	for i, s := range nodes {
		admins[i] = s.Client(tb)
		lo, hi := i*per, (i+1)*per-1
		if i == n-1 {
			hi = 16383
		}
		if err := admins[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			tb.Fatalf("redistest: CLUSTER ADDSLOTSRANGE on node %d: %v", i, err)
		}
	}
	for i := 1; i < n; i++ {
		host, port, _ := net.SplitHostPort(nodes[i].Addr)
		if err := admins[0].Do(ctx, "CLUSTER", "MEET", host, port, bus[i]).Err(); err != nil {
			tb.Fatalf("redistest: CLUSTER MEET: %v", err)
		}
	}
	for i, a := range admins {
		for {
			info, err := a.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r") {
				break
			}
			if ctx.Err() != nil {
				tb.Fatalf("redistest: node %d never reported the cluster ok: %v\n%s", i, err, info)
			}
			time.Sleep(20 * time.Millisecond) // polling the gossip, with the deadline above
		}
	}
	addrs := make([]string, n)
	for i, s := range nodes {
		addrs[i] = s.Addr
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 addrs,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		DialTimeout:           2 * time.Second,
		ReadTimeout:           2 * time.Second,
		WriteTimeout:          2 * time.Second,
		TLSConfig:             nodes[0].TLSConfig(),
	})
	tb.Cleanup(func() { c.Close() })
	// The client learns the slot map on first use; wait until it routes every slot.
	for {
		err := c.ForEachShard(ctx, func(ctx context.Context, s *redis.Client) error { return s.Ping(ctx).Err() })
		shards, serr := c.ClusterShards(ctx).Result()
		if err == nil && serr == nil && coversAll(shards) {
			break
		}
		if ctx.Err() != nil {
			tb.Fatalf("redistest: cluster client never saw every slot: %v %v", err, serr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c, nodes
}

func coversAll(shards []redis.ClusterShard) bool {
	var n int64
	for _, sh := range shards {
		for _, s := range sh.Slots {
			n += s.End - s.Start + 1
		}
	}
	return n == 16384
}

func freePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
