package redistest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartCluster starts n (1 to 16) redis-server processes as one Redis Cluster of masters,
// the 16384 hash slots split evenly between them, with a cluster-node-timeout of 5 s, and
// returns a cluster client with the limiter's recommended settings once every node
// reports the cluster ok and agrees on it, as [StartClusterWithReplicas] does, and the
// client has reached every node. Everything stops when the test ends. Like Start it skips
// without a redis-server binary.
func StartCluster(tb testing.TB, n int) (*redis.ClusterClient, []*Server) {
	tb.Helper()
	return startCluster(tb, n, nil)
}

// StartTLSCluster is [StartCluster] over TLS: every node is started as by [StartTLS],
// with certificates of one CA, and talks to the others over TLS (tls-cluster yes). The
// first node's certificate names 127.0.0.1 and localhost, the others' 127.0.0.1 only:
// a client that checks every node's certificate against the name it dialled the first
// by (localhost) fails, as it would where each node has a certificate of its own. The
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
	cl := startClusterWithReplicas(tb, ca, n, 0, 5*time.Second, nil)
	nodes := make([]*Server, n)
	for i, nd := range cl.Nodes {
		nodes[i] = nd.Server
	}
	c := cl.Client(tb, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The client learns the slot map on first use, from any node: they all agree now.
	if err := c.ForEachShard(ctx, func(ctx context.Context, s *redis.Client) error { return s.Ping(ctx).Err() }); err != nil {
		tb.Fatalf("redistest: cluster client: %v", err)
	}
	return c, nodes
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
