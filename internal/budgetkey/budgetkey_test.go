package budgetkey

import (
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
)

func TestKeyLayout(t *testing.T) {
	r := ratebudget.Rule{Name: "api", Algorithm: ratebudget.TokenBucket, Limit: 1, Window: time.Second}
	k := string(mustKey("rb", ratebudget.Check{Rule: r, Identity: "alice"}))
	if !strings.HasPrefix(k, "rb:{") || !strings.HasSuffix(k, "}:api:token") || len(k) != len("rb:{}:api:token")+DigestLen {
		t.Fatalf("key %q does not match rb:{<22-byte digest>}:api:token", k)
	}
	ks := string(mustKey("rb", ratebudget.Check{Rule: r, Identity: "alice", Scope: "/x"}))
	if !strings.HasPrefix(ks, k+":") || len(ks) != len(k)+1+DigestLen {
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
	k, _, _ := New(prefix, nil).Append(nil, nil, &c)
	return k
}

// TestKeySecret: with a secret the identity digest, and so the hash slot, depends on
// the secret: an attacker without it cannot search offline for identities that share
// a slot. The same secret gives the same keys (every replica must agree).
func TestKeySecret(t *testing.T) {
	r := ratebudget.Rule{Name: "api", Limit: 1, Window: time.Second}
	c := ratebudget.Check{Rule: r, Identity: "alice", Scope: "/x"}
	key := func(secret []byte) string {
		k, _, _ := New("rb", secret).Append(nil, nil, &c)
		return string(k)
	}
	plain, a, a2, b := key(nil), key([]byte("secret-a-0123456789")), key([]byte("secret-a-0123456789")), key([]byte("secret-b-0123456789"))
	if a != a2 {
		t.Fatalf("one secret gives two keys: %q, %q", a, a2)
	}
	if a == plain || a == b || b == plain {
		t.Fatalf("keys do not depend on the secret: none %q, a %q, b %q", plain, a, b)
	}
	if ia, ib := a[:len("rb:{")+DigestLen], b[:len("rb:{")+DigestLen]; ia == ib {
		t.Fatalf("identity digest %q does not depend on the secret", ia)
	}
	// Slots move with the secret: of 64 identities, most land in another slot.
	moved := 0
	for i := range 64 {
		c := ratebudget.Check{Rule: r, Identity: strings.Repeat("x", i)}
		_, s1, _ := New("rb", []byte("secret-a-0123456789")).Append(nil, nil, &c)
		_, s2, _ := New("rb", []byte("secret-b-0123456789")).Append(nil, nil, &c)
		if s1 != s2 {
			moved++
		}
	}
	if moved < 60 {
		t.Fatalf("only %d of 64 identities changed slot with the secret", moved)
	}
}

func TestKeySlot(t *testing.T) {
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	for tag, want := range map[string]uint16{"123456789": 0x31C3 & 16383, "foo": 12182, "bar": 5061, "": 0} {
		if got := Slot([]byte(tag)); got != want {
			t.Errorf("Slot(%q) = %d, want %d", tag, got, want)
		}
	}
}

func BenchmarkAppend(b *testing.B) {
	r := ratebudget.Rule{Name: "api", Limit: 1, Window: time.Second}
	c := ratebudget.Check{Rule: r, Identity: "203.0.113.7", Scope: "/v1/items/{id}"}
	for _, tc := range []struct {
		name   string
		secret []byte
	}{{"unkeyed", nil}, {"keyed", []byte("0123456789abcdef")}} {
		b.Run(tc.name, func(b *testing.B) {
			k := New("rb", tc.secret)
			var buf, scratch []byte
			b.ReportAllocs()
			for b.Loop() {
				buf, _, scratch = k.Append(buf[:0], scratch, &c)
			}
		})
	}
}
