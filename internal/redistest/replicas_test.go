package redistest_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/internal/redistest"
)

// TestClusterFailover: the cluster starts with a replica per master in sync, and a
// replica takes over its killed master's slots within a few node timeouts.
func TestClusterFailover(t *testing.T) {
	start := time.Now()
	cl := redistest.StartClusterWithReplicas(t, 3, 1, time.Second)
	t.Logf("3 masters + 3 replicas ready in %v", time.Since(start).Round(time.Millisecond))
	c := cl.Client(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := "k"
	slot := int(c.ClusterKeySlot(ctx, key).Val())
	m := cl.SlotOwner(slot)
	// Replication is asynchronous: wait until the replica has the write before the kill.
	// WAIT counts the replicas that acknowledged the writes of its own connection (since
	// Redis 7.2 and on Valkey; a connection that wrote nothing has it return at once), so
	// the write and the WAIT share one connection, to the slot's owner: a MOVED error if
	// SlotOwner names another node.
	mc := m.Client(t).Conn()
	defer mc.Close()
	if err := mc.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatalf("SET on the node SlotOwner names for slot %d: %v", slot, err)
	}
	if got, err := c.Get(ctx, key).Result(); got != "v" {
		t.Fatalf("the cluster client reads %q (%v) for slot %d's key", got, err, slot)
	}
	if n, err := mc.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n < 1 {
		t.Fatalf("WAIT 1: %d replicas acknowledged, %v", n, err)
	}
	r := cl.ReplicasOf(m)[0]
	m.Kill(t)
	killed := time.Now()
	promoted := cl.WaitPromoted(t, r, 10*cl.NodeTimeout+10*time.Second)
	t.Logf("replica promoted %v after the kill (node timeout %v)", promoted.Sub(killed).Round(time.Millisecond), cl.NodeTimeout)
	if got, err := r.Client(t).Get(ctx, key).Result(); got != "v" {
		t.Fatalf("the promoted replica has %q (%v), want the replicated value", got, err)
	}
	if n := r.ScriptCalls(t); n != 0 {
		t.Fatalf("%d script calls on a fresh node", n)
	}
}

// TestClusterAgreesAtStart: when StartClusterWithReplicas returns, every node maps every
// slot to the master the even split names, with that master's replicas, also with
// cluster-require-full-coverage no, where a node reports cluster_state:ok before it has
// heard of the other masters' slots. A node that has not answers a command for those
// slots with CLUSTERDOWN Hash slot not served, and a cluster client that loads its slot
// map from it routes them at random.
func TestClusterAgreesAtStart(t *testing.T) {
	for _, tc := range []struct {
		name     string
		replicas int
	}{{"masters", 0}, {"masters again", 0}, {"with replicas", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cl := redistest.StartClusterWithReplicas(t, 3, tc.replicas, time.Minute, "--cluster-require-full-coverage", "no")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for i, n := range cl.Nodes {
				shards, err := n.Client(t).ClusterShards(ctx).Result()
				if err != nil {
					t.Fatalf("node %d: CLUSTER SHARDS: %v", i, err)
				}
				covered := 0
				for _, sh := range shards {
					var master string
					var replicas []string
					for _, sn := range sh.Nodes {
						if sn.Role == "master" {
							master = sn.ID
						} else {
							replicas = append(replicas, sn.ID)
						}
					}
					for _, s := range sh.Slots {
						covered += int(s.End - s.Start + 1)
						m := cl.SlotOwner(int(s.Start))
						var want []string
						for _, r := range cl.ReplicasOf(m) {
							want = append(want, r.ID)
						}
						if cl.SlotOwner(int(s.End)) != m || master != m.ID || !slices.Equal(replicas, want) {
							t.Errorf("node %d maps slots %d-%d to master %s with replicas %v, want %s with %v", i, s.Start, s.End, master, replicas, m.ID, want)
						}
					}
				}
				if covered != 16384 {
					t.Errorf("node %d maps %d slots, want all 16384: %+v", i, covered, shards)
				}
			}
		})
	}
}
