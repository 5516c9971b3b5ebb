package redistest_test

import (
	"context"
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
	if err := c.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := m.Client(t).Get(ctx, key).Val(); got != "v" {
		t.Fatalf("slot %d's key not on the node SlotOwner names (%q)", slot, got)
	}
	// Replication is asynchronous: wait until the replica has the write before the kill.
	if n, err := m.Client(t).Wait(ctx, 1, 5*time.Second).Result(); err != nil || n < 1 {
		t.Fatalf("WAIT 1: %d replicas acknowledged, %v", n, err)
	}
	r := cl.ReplicasOf(m)[0]
	m.Kill(t)
	killed := time.Now()
	promoted := cl.WaitPromoted(t, r, 10*cl.NodeTimeout+10*time.Second)
	t.Logf("replica promoted %v after the kill (node timeout %v)", promoted.Sub(killed).Round(time.Millisecond), cl.NodeTimeout)
	if got := r.Client(t).Get(ctx, key).Val(); got != "v" {
		t.Fatalf("the promoted replica has %q, want the replicated value", got)
	}
	if n := r.ScriptCalls(t); n != 0 {
		t.Fatalf("%d script calls on a fresh node", n)
	}
}
