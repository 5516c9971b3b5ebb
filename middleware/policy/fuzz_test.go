package policy

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse: any content is either a policy or refused with a *Error; never a panic.
func FuzzParse(f *testing.F) {
	paths, _ := filepath.Glob("testdata/*.yaml")
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("rules: [{name: a, identity: ip, time: {limit: 1, window: 1s}, replaces: [a]}]"))
	f.Add([]byte("a: &x [*x]"))
	f.Add([]byte("client_ip: {trusted_proxies: [10.0.0.0/8, \"2001:db8::/32\"], header: Forwarded, require_forwarding: true, ipv4_prefix: 24, ipv6_prefix: 56}\n" +
		"rules: [{name: a, identity: ip, match: {ip: [192.0.2.0/24]}, time: {limit: 1, window: 1s}}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("f.yaml", data)
		var pe *Error
		switch {
		case err != nil && !errors.As(err, &pe):
			t.Fatalf("Parse = %T %v, want a *Error", err, err)
		case err == nil && (p == nil || len(p.rules) == 0):
			t.Fatalf("Parse accepted a policy without rules")
		}
	})
}
