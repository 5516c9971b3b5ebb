package lua

import (
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
)

func TestKeyLayout(t *testing.T) {
	r := ratebudget.Rule{Name: "api", Algorithm: ratebudget.TokenBucket, Limit: 1, Window: time.Second}
	k := string(mustKey("rb", ratebudget.Check{Rule: r, Identity: "alice"}))
	if !strings.HasPrefix(k, "rb:{") || !strings.HasSuffix(k, "}:api:token") || len(k) != len("rb:{}:api:token")+digestLen {
		t.Fatalf("key %q does not match rb:{<22-byte digest>}:api:token", k)
	}
	ks := string(mustKey("rb", ratebudget.Check{Rule: r, Identity: "alice", Scope: "/x"}))
	if !strings.HasPrefix(ks, k+":") || len(ks) != len(k)+1+digestLen {
		t.Fatalf("scoped key %q, want %q + :<digest>", ks, k)
	}
	seen := map[string]bool{}
	for _, c := range [][2]string{{"a:b", "c"}, {"a", "b:c"}, {"a:b:c", ""}, {"", "a:b:c"}, {"a", "bc"}, {"ab", "c"}} {
		k := string(mustKey("rb", ratebudget.Check{Rule: r, Identity: c[0], Scope: c[1]}))
		if seen[k] {
			t.Fatalf("identity %q scope %q collides: %q", c[0], c[1], k)
		}
		seen[k] = true
	}
	huge := strings.Repeat("{x}\x00\r\n", 200_000)
	if k := mustKey("rb", ratebudget.Check{Rule: r, Identity: huge, Scope: huge}); len(k) != len(ks) || strings.Count(string(k), "{") != 1 {
		t.Fatalf("hostile identity gives key %q", k)
	}
}

func mustKey(prefix string, c ratebudget.Check) []byte {
	k, _, _ := appendKey(nil, nil, prefix, &c)
	return k
}

func TestKeySlot(t *testing.T) {
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	for tag, want := range map[string]uint16{"123456789": 0x31C3 & 16383, "foo": 12182, "bar": 5061, "": 0} {
		if got := keySlot([]byte(tag)); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", tag, got, want)
		}
	}
}

func BenchmarkAppendKey(b *testing.B) {
	r := ratebudget.Rule{Name: "api", Limit: 1, Window: time.Second}
	c := ratebudget.Check{Rule: r, Identity: "203.0.113.7", Scope: "/v1/items/{id}"}
	var buf, scratch []byte
	b.ReportAllocs()
	for b.Loop() {
		buf, _, scratch = appendKey(buf[:0], scratch, "rb", &c)
	}
}
