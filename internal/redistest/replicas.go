package redistest

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of redis-server processes owned by one test, masters with
// replicas, started by [StartClusterWithReplicas].
type Cluster struct {
	// Nodes are the cluster's servers: the masters first, then their replicas.
	Nodes []*Node
	// NodeTimeout is the cluster-node-timeout the nodes run with: how long a node must be
	// unreachable before the others start to fail it over.
	NodeTimeout time.Duration
}

// Node is one server of a [Cluster].
type Node struct {
	*Server
	// ID is the node's cluster node ID.
	ID string
	// Master is the index in Cluster.Nodes of the master this node was started to
	// replicate, or -1 for a node started as a master. Roles change on failover; this
	// field does not.
	Master int
}

// StartClusterWithReplicas starts masters (1 to 16) redis-server processes that split the
// 16384 hash slots evenly, each with replicasPerMaster (0 to 4) replicas, with
// cluster-node-timeout nodeTimeout (at least 100ms) and settings that make a failover
// quick and certain: a replica fails over however stale its data
// (cluster-replica-validity-factor 0), replicas never migrate, and replication is
// diskless. It returns once every replica is in sync and every node reports the cluster
// ok and agrees on it: every node connected, none failing, every slot with the master
// the even split names (see [Cluster.SlotOwner]), every replica with its master. args
// are added to every server's command line (e.g. "--cluster-require-full-coverage",
// "no"). Everything stops when the test ends. Like [Start] it skips without a
// redis-server binary.
func StartClusterWithReplicas(tb testing.TB, masters, replicasPerMaster int, nodeTimeout time.Duration, args ...string) *Cluster {
	tb.Helper()
	return startClusterWithReplicas(tb, nil, masters, replicasPerMaster, nodeTimeout, args)
}

// startClusterWithReplicas is [StartClusterWithReplicas], over TLS with certificates of
// ca (for clients, the cluster bus and replication) if ca is not nil: the first
// node's certificate names 127.0.0.1 and localhost, the others' 127.0.0.1 only.
func startClusterWithReplicas(tb testing.TB, ca *testCA, masters, replicasPerMaster int, nodeTimeout time.Duration, args []string) *Cluster {
	tb.Helper()
	if masters < 1 || masters > 16 || replicasPerMaster < 0 || replicasPerMaster > 4 || nodeTimeout < 100*time.Millisecond {
		tb.Fatalf("redistest: cluster of %d masters, %d replicas each, node timeout %v", masters, replicasPerMaster, nodeTimeout)
	}
	n := masters * (1 + replicasPerMaster)
	cl := &Cluster{NodeTimeout: nodeTimeout}
	bus := make([]int, n)
	rest := ca
	if ca != nil {
		rest = ca.ipOnly(tb)
	}
	for i := range n {
		bus[i] = freePort(tb) // the default bus port (port+10000) may not be free
		line := []string{"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus[i]),
			"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10),
			"--cluster-replica-validity-factor", "0",
			"--cluster-allow-replica-migration", "no",
			"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
			"--repl-diskless-load", "on-empty-db"}
		if ca != nil {
			line = append(line, "--tls-cluster", "yes", "--tls-replication", "yes")
		}
		nodeCA := ca
		if i > 0 {
			nodeCA = rest
		}
		s := startWith(tb, "", nodeCA, append(line, args...))
		master := -1
		if i >= masters {
			master = (i - masters) % masters
		}
		cl.Nodes = append(cl.Nodes, &Node{Server: s, Master: master})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admins := make([]*redis.Client, n)
	for i, nd := range cl.Nodes {
		admins[i] = nd.Client(tb)
		id, err := admins[i].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			tb.Fatalf("redistest: CLUSTER MYID on node %d: %v", i, err)
		}
		nd.ID = id
		// Distinct epochs before the nodes meet, as redis-cli --cluster create sets them:
		// failover elections then never start from a collision.
		if err := admins[i].Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			tb.Fatalf("redistest: CLUSTER SET-CONFIG-EPOCH on node %d: %v", i, err)
		}
	}
	for i := range masters {
		lo, hi := slotRange(i, masters)
		if err := admins[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			tb.Fatalf("redistest: CLUSTER ADDSLOTSRANGE on node %d: %v", i, err)
		}
	}
	for i := 1; i < n; i++ {
		host, port, _ := net.SplitHostPort(cl.Nodes[i].Addr)
		if err := admins[0].Do(ctx, "CLUSTER", "MEET", host, port, bus[i]).Err(); err != nil {
			tb.Fatalf("redistest: CLUSTER MEET: %v", err)
		}
	}
	for i, a := range admins {
		poll(ctx, tb, fmt.Sprintf("node %d to know all %d nodes", i, n), func() (bool, string) {
			info, err := a.ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r"), fmt.Sprint(info, err)
		})
	}
	for i, nd := range cl.Nodes {
		if nd.Master < 0 {
			continue
		}
		master := cl.Nodes[nd.Master].ID
		// The replica must have learnt of its master as a master through the gossip first.
		poll(ctx, tb, fmt.Sprintf("node %d to replicate %s", i, master), func() (bool, string) {
			err := admins[i].Do(ctx, "CLUSTER", "REPLICATE", master).Err()
			return err == nil, fmt.Sprint(err)
		})
	}
	for i, nd := range cl.Nodes {
		if nd.Master >= 0 {
			poll(ctx, tb, fmt.Sprintf("replica %d to be in sync", i), func() (bool, string) {
				info, err := admins[i].Info(ctx, "replication").Result()
				return err == nil && strings.Contains(info, "master_link_status:up"), fmt.Sprint(info, err)
			})
		}
	}
	// cluster_state:ok alone is not enough: with cluster-require-full-coverage no a node
	// reports it as soon as it serves slots of its own, before it has heard of the other
	// masters' slots (it answers commands for those with CLUSTERDOWN Hash slot not
	// served), and a node it has heard of by gossip only may not be connected yet.
	for i, a := range admins {
		poll(ctx, tb, fmt.Sprintf("node %d to agree on the cluster's nodes and slots", i), func() (bool, string) {
			return cl.agreed(ctx, a, masters)
		})
	}
	return cl
}

// agreed reports whether the node a reports the cluster ok, its CLUSTER NODES reply
// agrees (see [Cluster.agrees]) and so does its CLUSTER SHARDS reply (see
// [Cluster.shardsAgree]), with the reply that did not as the state.
func (c *Cluster) agreed(ctx context.Context, a *redis.Client, masters int) (bool, string) {
	info, err := a.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_state:ok") {
		return false, fmt.Sprint(info, err)
	}
	nodes, err := a.ClusterNodes(ctx).Result()
	if err != nil {
		return false, err.Error()
	}
	if !c.agrees(nodes, masters) {
		return false, nodes
	}
	return c.shardsAgree(ctx, a)
}

// shardsAgree reports whether a's CLUSTER SHARDS reply groups every replica with the
// master it was started for, in the shard of that master's slots, with the reply as the
// state. CLUSTER NODES agreeing is not enough on every server: Redis 7.0 groups a
// replica with the master it follows, but Valkey (as Redis since 7.2) groups nodes by
// shard ID, which a replica takes from its master on CLUSTER REPLICATE and the other
// nodes learn by gossip (a ping extension) only later; until then they list the replica
// in a shard of its own, without slots.
func (c *Cluster) shardsAgree(ctx context.Context, a *redis.Client) (bool, string) {
	shards, err := a.ClusterShards(ctx).Result()
	if err != nil {
		return false, err.Error()
	}
	state := fmt.Sprintf("%+v", shards)
	for _, sh := range shards {
		var replicas, want []string
		for _, sn := range sh.Nodes {
			if sn.Role != "master" {
				replicas = append(replicas, sn.ID)
			}
		}
		if len(sh.Slots) == 0 {
			if len(replicas) > 0 {
				return false, state // a replica not yet in its master's shard
			}
			continue
		}
		for _, r := range c.ReplicasOf(c.SlotOwner(int(sh.Slots[0].Start))) {
			want = append(want, r.ID)
		}
		slices.Sort(replicas)
		slices.Sort(want)
		if !slices.Equal(replicas, want) {
			return false, state
		}
	}
	return true, state
}

// agrees reports whether nodes, a node's CLUSTER NODES reply, lists exactly c's nodes,
// each connected and neither failing nor in a handshake, every master with the slots
// StartClusterWithReplicas gave it and every replica replicating the master it was
// started for.
func (c *Cluster) agrees(nodes string, masters int) bool {
	lines := strings.Split(strings.TrimSpace(nodes), "\n")
	if len(lines) != len(c.Nodes) {
		return false
	}
	byID := make(map[string][]string, len(lines))
	for _, l := range lines {
		// <id> <ip:port@cport> <flags> <master> <ping-sent> <pong-recv> <config-epoch> <link-state> <slot>...
		f := strings.Fields(l)
		if len(f) < 8 {
			return false
		}
		byID[f[0]] = f
	}
	for i, n := range c.Nodes {
		f, ok := byID[n.ID]
		if !ok || f[7] != "connected" {
			return false
		}
		flags := strings.Split(f[2], ",")
		if slices.ContainsFunc(flags, func(fl string) bool {
			return fl == "fail" || fl == "fail?" || fl == "handshake" || fl == "noaddr"
		}) {
			return false
		}
		if n.Master >= 0 {
			if !slices.Contains(flags, "slave") || f[3] != c.Nodes[n.Master].ID || len(f) != 8 {
				return false
			}
			continue
		}
		lo, hi := slotRange(i, masters)
		if !slices.Contains(flags, "master") || len(f) != 9 || f[8] != strconv.Itoa(lo)+"-"+strconv.Itoa(hi) {
			return false
		}
	}
	return true
}

// slotRange returns the first and last slot of master i of masters by the even split.
func slotRange(i, masters int) (lo, hi int) {
	per := 16384 / masters
	lo, hi = i*per, (i+1)*per-1
	if i == masters-1 {
		hi = 16383
	}
	return lo, hi
}

// poll calls cond until it reports true, failing the test with cond's last state when ctx
// ends. Cluster state changes by gossip, which offers nothing to wait on but polling.
func poll(ctx context.Context, tb testing.TB, what string, cond func() (bool, string)) {
	tb.Helper()
	for {
		ok, state := cond()
		if ok {
			return
		}
		if ctx.Err() != nil {
			tb.Fatalf("redistest: waited in vain for %s: %s", what, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Addrs returns every node's address, masters first: seed addresses for a cluster client.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// Masters returns the nodes started as masters.
func (c *Cluster) Masters() []*Node {
	var ms []*Node
	for _, n := range c.Nodes {
		if n.Master < 0 {
			ms = append(ms, n)
		}
	}
	return ms
}

// ReplicasOf returns the nodes started as replicas of m.
func (c *Cluster) ReplicasOf(m *Node) []*Node {
	var rs []*Node
	for _, n := range c.Nodes {
		if n.Master >= 0 && c.Nodes[n.Master] == m {
			rs = append(rs, n)
		}
	}
	return rs
}

// SlotOwner returns the node that served slot when the cluster started, by the even
// split StartClusterWithReplicas made.
func (c *Cluster) SlotOwner(slot int) *Node {
	ms := c.Masters()
	i := slot / (16384 / len(ms))
	if i >= len(ms) {
		i = len(ms) - 1
	}
	return ms[i]
}

// Client returns a cluster client of c with the options of [StartCluster]'s client,
// changed by edit if it is not nil, closed when the test ends. It makes no call.
func (c *Cluster) Client(tb testing.TB, edit func(*redis.ClusterOptions)) *redis.ClusterClient {
	opt := &redis.ClusterOptions{
		Addrs:                 c.Addrs(),
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		DialTimeout:           2 * time.Second,
		ReadTimeout:           2 * time.Second,
		WriteTimeout:          2 * time.Second,
		TLSConfig:             c.Nodes[0].TLSConfig(),
	}
	if edit != nil {
		edit(opt)
	}
	cc := redis.NewClusterClient(opt)
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// Pid returns the node's process ID.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// WaitPromoted polls the replica r until it reports itself a master serving slots and
// the cluster ok, for at most within, and returns when it saw that. The test fails if it
// never does.
func (c *Cluster) WaitPromoted(tb testing.TB, r *Node, within time.Duration) time.Time {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	a := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second, TLSConfig: r.TLSConfig()})
	defer a.Close()
	poll(ctx, tb, "the promotion of "+r.Addr, func() (bool, string) {
		role, err := a.Do(ctx, "ROLE").Slice()
		if err != nil || len(role) == 0 || role[0] != "master" {
			return false, fmt.Sprint(role, err)
		}
		info, err := a.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok"), fmt.Sprint(info, err)
	})
	return time.Now()
}

// ScriptCalls returns how many times the server has run a script (EVAL and EVALSHA,
// from INFO commandstats) since it started or since CONFIG RESETSTAT.
func (s *Server) ScriptCalls(tb testing.TB) int64 {
	tb.Helper()
	return s.Calls(tb, "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall")
}

// Calls returns how many times the server has run the named commands (as INFO
// commandstats names them, e.g. "evalsha" or "cluster|slots"), together.
func (s *Server) Calls(tb testing.TB, commands ...string) int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, TLSConfig: s.TLSConfig()})
	defer a.Close()
	stats, err := a.InfoMap(ctx, "commandstats").Result()
	if err != nil {
		tb.Fatalf("redistest: INFO commandstats: %v", err)
	}
	var total int64
	for _, name := range commands {
		v := stats["Commandstats"]["cmdstat_"+name] // calls=3,usec=...,rejected_calls=0,failed_calls=0
		for _, f := range strings.Split(v, ",") {
			if k, num, ok := strings.Cut(f, "="); ok && k == "calls" {
				c, _ := strconv.ParseInt(num, 10, 64)
				total += c
			}
		}
	}
	return total
}
