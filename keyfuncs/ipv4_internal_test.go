package keyfuncs

import (
	"net/netip"
	"testing"
)

// FuzzParseIPv4: the fast IPv4 parser accepts only what netip.ParseAddr parses as the
// same IPv4 address, and accepts every canonical dotted quad.
func FuzzParseIPv4(f *testing.F) {
	for _, s := range []string{"192.0.2.1", "0.0.0.0", "255.255.255.255", "256.1.1.1", "01.2.3.4",
		"1.2.3", "1.2.3.4.5", "1..2.3", ".1.2.3", "1.2.3.", "1.2.3.4 ", "::ffff:1.2.3.4", "1.2.3.04", "10.0.0.0", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseIPv4(s)
		want, err := netip.ParseAddr(s)
		if ok && (err != nil || !want.Is4() || got != want) {
			t.Fatalf("parseIPv4(%q) = %v, netip says %v, %v", s, got, want, err)
		}
		if !ok && err == nil && want.Is4() && want.Zone() == "" {
			t.Fatalf("parseIPv4(%q) refused what netip parses as %v", s, want)
		}
	})
}
