package keyfuncs

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// splitJoined decodes a readable joinStrings result, reporting false for a digest or a
// malformed encoding.
func splitJoined(s string) ([]string, bool) {
	var parts []string
	for s != "" {
		i := strings.IndexByte(s, ':')
		if i <= 0 {
			return nil, false
		}
		n, err := strconv.Atoi(s[:i])
		if err != nil || n < 0 || i+1+n > len(s) {
			return nil, false
		}
		e := s[i+1 : i+1+n]
		s = s[i+1+n:]
		r := strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")
		parts = append(parts, r.Replace(e))
	}
	return parts, true
}

func FuzzJoin(f *testing.F) {
	f.Add("a:b|c", "a|b:c")
	f.Add("", "|")
	f.Add("{x}|%7B", "%7Bx%7D|{")
	f.Add(strings.Repeat("y", 600), strings.Repeat("y", 599)+"|y")
	f.Add("1:a", "1:a|")
	f.Fuzz(func(t *testing.T, a, b string) {
		pa, pb := strings.Split(a, "|"), strings.Split(b, "|")
		ja, jb := joinStrings(pa...), joinStrings(pb...)
		if (ja == jb) != slices.Equal(pa, pb) {
			t.Fatalf("joinStrings(%q)=%q, joinStrings(%q)=%q", pa, ja, pb, jb)
		}
		if strings.ContainsAny(ja, "{}") {
			t.Fatalf("brace in %q", ja)
		}
		if len(ja) > maxJoinedLen {
			t.Fatalf("unbounded: %d bytes", len(ja))
		}
		if ja[0] == hashMark {
			if len(ja) != hashedLen {
				t.Fatalf("digest of %d bytes", len(ja))
			}
			return
		}
		got, ok := splitJoined(ja)
		if !ok || !slices.Equal(got, pa) {
			t.Fatalf("decode(%q) = %q, want %q", ja, got, pa)
		}
	})
}
